"""Map the root folders app/ core/ probes/ engine/ widgets/ to hwtui.app, hwtui.core, ...

Computed rather than listed so a new subpackage cannot be forgotten, and so nothing generic such
as ``app`` or ``engine`` lands at the top of site-packages. The ``hwtui`` package itself is the
folder hwtui/ (its entries are links for the clone; only its own modules are installed).
"""

from setuptools import find_packages, setup

ROOTS = ("app", "core", "probes", "engine", "widgets")

packages, package_dir = ["hwtui"], {"hwtui": "hwtui"}
for root in ROOTS:
    packages.append(f"hwtui.{root}")
    package_dir[f"hwtui.{root}"] = root
    packages += [f"hwtui.{root}.{sub}" for sub in find_packages(root)]

setup(packages=packages, package_dir=package_dir, package_data={"": ["*.tcss", "*.json", "*.txt"], "hwtui": ["py.typed"]})
