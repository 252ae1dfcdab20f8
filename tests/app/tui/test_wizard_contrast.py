"""The wizard reads at WCAG AA in the default theme, and Detect explains an empty table (issue 25).

Contrast is computed from the colours Textual resolves for the real Engine step: placeholders at
least 4.5:1 on their field, field text at least 4.5:1, and focus shown by something other than one
grey step (a 3:1 non-text indicator: the accent bar beside the focused field or choice).
"""

from __future__ import annotations

from textual.color import Color

from hwtui.app.tui.app import HwtuiApp
from hwtui.app.tui.config import TuiConfig, config_path
from hwtui.probes.host import ReplayHost
from tests.app.tui.conftest import FixedSampler, wait_for


def _luminance(c: Color) -> float:
    def channel(v: int) -> float:
        x = v / 255
        return x / 12.92 if x <= 0.03928 else ((x + 0.055) / 1.055) ** 2.4

    r, g, b = c.rgb
    return 0.2126 * channel(r) + 0.7152 * channel(g) + 0.0722 * channel(b)


def contrast(a: Color, b: Color) -> float:
    hi, lo = sorted((_luminance(a), _luminance(b)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


async def test_engine_step_focus_and_placeholders_meet_wcag_aa(snapshots):
    from textual.widgets import Input

    from hwtui.widgets.choice_toggle import ChoiceToggle

    app = HwtuiApp(ReplayHost.load(snapshots["h100_x8"]), TuiConfig.load(), config_file=config_path(),
                   sampler_factory=FixedSampler, start_step="engine")
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_for(pilot, lambda: getattr(app.screen, "STEP", "") == "engine")
        await pilot.pause()
        screen = app.screen
        assert app.theme == "textual-dark", "the default theme"
        plan, device = screen.query_one("#in-plan", Input), screen.query_one("#in-device", Input)
        assert plan.value == "" and plan.placeholder
        placeholder = Color.from_rich_color(plan.get_component_rich_style("input--placeholder").color)
        field_bg = plan.background_colors[1]  # as painted: the field's own over what is behind it
        assert contrast(placeholder, field_bg) >= 4.5, contrast(placeholder, field_bg)
        assert contrast(plan.styles.color, field_bg) >= 4.5
        device.focus()
        await pilot.pause()
        # The focused field's indicator: an accent bar, 3:1 or more against the field around it.
        kind, colour = device.styles.border_left
        assert kind == "wide" and contrast(colour, field_bg) >= 3.0, (kind, colour)
        assert plan.styles.border_left[0] in ("blank", "", "none"), "only the focused field has the bar"
        mode = screen.query_one("#mode", ChoiceToggle)
        mode.focus()
        await pilot.pause()
        kind, colour = mode.styles.border_left
        assert kind == "wide" and contrast(colour, mode.background_colors[1]) >= 3.0
        # One titled row per choice group.
        assert screen.query_one("#choices").region.y != screen.query_one("#source-row").region.y
        titles = [str(label.render()) for label in screen.query(".group-title")]
        assert titles == ["Engine", "Source"]


async def test_detect_explains_a_machine_without_accelerators(snapshots, tmp_path):
    import json

    from tests.app.tui.conftest import build_snapshot

    snap = tmp_path / "cpu.json"
    snap.write_text(json.dumps(build_snapshot("laptop_no_gpu", tmp_path / "tree")))
    app = HwtuiApp(ReplayHost.load(snap), TuiConfig.load(), config_file=config_path(), sampler_factory=FixedSampler)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: getattr(app.screen, "STEP", "") == "detect" and app.screen.has_class("-none"))
        screen = app.screen
        assert not screen.query_one("#devices").display and screen.query_one("#none-found").display
        text = str(screen.query_one("#none-found").render())
        assert "No accelerator found" in text and "CPU ranks" in text and "list-gpus --all" in text
        # Every line break it writes ends a sentence: the panel wraps the rest at its width (a break
        # mid-sentence left "in /dev or" alone on a line at 100 columns).
        assert all(line.rstrip().endswith((".", "?", ":")) for line in text.split("\n")), text
