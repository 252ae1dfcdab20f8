from hypothesis import given
from hypothesis import strategies as st

from hwtui.core.redact import MASK, redact, redact_env, redact_text


def test_secret_names_masked_whatever_the_value():
    env = redact_env({"HF_TOKEN": "abc", "AWS_SECRET_ACCESS_KEY": "k", "DB_PASSWORD": "p", "MY_API_KEY": "z",
                      "MASTER_ADDR": "10.0.0.1", "SSH_AUTH_SOCK": "/tmp/agent", "NCCL_IB_HCA": "mlx5_0"})
    assert env["HF_TOKEN"] == env["AWS_SECRET_ACCESS_KEY"] == env["DB_PASSWORD"] == env["MY_API_KEY"] == MASK
    assert env["MASTER_ADDR"] == "10.0.0.1" and env["SSH_AUTH_SOCK"] == "/tmp/agent" and env["NCCL_IB_HCA"] == "mlx5_0"


def test_credentials_in_free_text():
    text = ("pip index https://bob:hunter2@pypi.corp/simple and s3://AKIAABCDEFGHIJKLMNOP "
            "?token=deadbeef&x=1 Authorization: Bearer abcdefghijklmnop ghp_" + "a" * 36)
    out = redact_text(text)
    for secret in ("hunter2", "bob:", "deadbeef", "abcdefghijklmnop", "ghp_aaaa", "AKIAABCDEFGHIJKLMNOP"):
        assert secret not in out
    assert "https://" in out and "pypi.corp/simple" in out and "x=1" in out


def test_nested_structures():
    doc = {"env": {"WANDB_API_KEY": "w"}, "cmd": ["curl", "https://u:p@h/x"], "n": 3}
    out = redact(doc)
    assert out == {"env": {"WANDB_API_KEY": MASK}, "cmd": ["curl", f"https://{MASK}@h/x"], "n": 3}


@given(st.text())
def test_redact_text_never_raises_and_is_idempotent(s):
    once = redact_text(s)
    assert redact_text(once) == once


def test_a_value_of_many_bare_credentials_is_masked_whole():
    # The one-scan path for `user:password@host` tokens must mask exactly what the token-by-token
    # path masks, in every position (start, middle, end, beside URLs and assignments).
    from hwtui.core.redact import MASK, redact_text

    creds = " ".join(f"u{i}:pw{i}@h{i}" for i in range(2000))
    out = redact_text(f"MASTER_ADDR=admin:root@m {creds} https://x:y@z/p git@github.com:r")
    assert "pw" not in out and "root" not in out and ":y@" not in out
    assert out.count(f"{MASK}@h") == 2000 and "git@github.com:r" in out and f"MASTER_ADDR={MASK}@m" in out
    assert redact_text(out) == out
