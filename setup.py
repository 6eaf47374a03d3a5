"""Install robot_latency as a ROS 2 ament_python package (colcon) or with plain pip."""

import os
import sys
from glob import glob

from setuptools import find_packages, setup
from setuptools.command.develop import develop
from setuptools.command.install import install

PACKAGE = "robot_latency"


# Where the console scripts go: <prefix>/lib/<package> for colcon (`ros2 run` looks there), the
# environment's bin/ for pip (any pip, PEP 660 or the legacy `setup.py develop` of Ubuntu 22.04's
# pip 22.0.2 and setuptools 59.6). colcon passes setup.cfg's install_scripts on the command line
# (recent colcon-core) or passes --prefix (older releases; setuptools ignores setup.cfg's install
# paths inside a venv), and for --symlink-install runs `develop` with --prefix or with sys.prefix
# redirected to the install space (its sitecustomize keeps the original in sys.real_prefix).
def _colcon_prefix(prefix: str | None) -> str | None:
    return prefix or (sys.prefix if getattr(sys, "real_prefix", None) else None)


class _Install(install):
    def finalize_options(self) -> None:
        prefix = _colcon_prefix(self.prefix)
        if prefix and not self.install_scripts:
            self.install_scripts = os.path.join(prefix, "lib", PACKAGE)
        super().finalize_options()


class _Develop(develop):
    def finalize_options(self) -> None:
        prefix = _colcon_prefix(self.prefix)
        if prefix and not self.script_dir:
            self.script_dir = os.path.join(prefix, "lib", PACKAGE)
        super().finalize_options()


# Lower bounds: the oldest versions the tests run with (requirements/compat.txt, `make compat`);
# the exact pins of the main test venv are in requirements/base.txt, a Jetson's in jetson.txt.
INSTALL_REQUIRES = [
    "numpy>=1.23.5",
    "psutil>=7.2.2",
    "PyYAML>=6.0.3",
    "gguf>=0.19.0",
    "rosbags>=0.11.9",
    "matplotlib>=3.6.3",
    "tqdm>=4.70.1",
    "onnx>=1.23.2",
    "jsonschema>=4.26.0",
    "mcap>=1.6.0",
    "Pillow>=12.3.0",
]

EXTRAS = {
    "llama": ["llama-cpp-python>=0.3.36"],
    "onnx": ["onnxruntime-gpu>=1.31.1"],
    "offboard": ["openai>=2.54.0", "httpx>=0.28.1"],
    # ROS 2 Kilted as pip wheels (CPython 3.11, x86-64). On a Jetson use ROS 2 from apt instead.
    "ros": [
        "ros-kilted-rclpy[fastrtps]>=9.1",
        "ros-kilted-std-msgs>=5.5",
        "ros-kilted-diagnostic-msgs>=5.5",
    ],
    "test": ["pytest>=7", "ruff>=0.5", "colcon-common-extensions>=0.3", "osrf-pycommon>=2.0",
             "lark>=1.1", "vermin>=1.6"],
    "train": ["torch>=2.0"],
}

setup(
    name=PACKAGE,
    version="0.1.0",
    description="Edge-robot control-loop latency testbed for language-model planners",
    python_requires=">=3.10",
    packages=find_packages(include=[PACKAGE, f"{PACKAGE}.*"]),
    include_package_data=True,
    # Explicit depths: setuptools < 62.3 (Ubuntu 22.04 has 59.6) does not expand "**".
    package_data={PACKAGE: ["data/*", "data/layouts/*", "data/models/*", "data/profiles/*",
                           "data/streams/*/*", "data/vocab/*"]},
    data_files=[
        ("share/ament_index/resource_index/packages", [f"resource/{PACKAGE}"]),
        (f"share/{PACKAGE}", ["package.xml"]),
        (f"share/{PACKAGE}/launch", glob("launch/*.launch.py")),
        (f"share/{PACKAGE}/config", glob("config/*.yaml")),
    ],
    install_requires=INSTALL_REQUIRES,
    extras_require=EXTRAS,
    zip_safe=False,
    cmdclass={"install": _Install, "develop": _Develop},
    maintainer="robot_latency maintainers",
    maintainer_email="maintainers@robot-latency.invalid",
    license="Apache-2.0",
    tests_require=["pytest"],
    entry_points={
        "console_scripts": [
            "robot-latency = robot_latency.cli:main",
            # robot_latency.ros.entry: one line naming what is missing (ROS 2, the interface
            # package) where a plain pip install has no ROS, instead of a traceback
            "planner_node = robot_latency.ros.entry:planner_node",
            "managed_planner_node = robot_latency.ros.entry:managed_planner_node",
            "bag_replayer = robot_latency.ros.entry:bag_replayer",
        ],
    },
)
