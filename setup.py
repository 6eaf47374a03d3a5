"""Install robot_latency as a ROS 2 ament_python package (colcon) or with plain pip."""

from glob import glob

from setuptools import find_packages, setup

PACKAGE = "robot_latency"

# Loose lower bounds here; the exact pins the project tests with are in requirements/*.txt.
INSTALL_REQUIRES = [
    "numpy>=1.21",
    "psutil>=5.9",
    "PyYAML>=5.4",
    "gguf>=0.10",
    "rosbags>=0.10",
    "matplotlib>=3.5",
    "tqdm>=4.60",
    "onnx>=1.15",
]

EXTRAS = {
    "llama": ["llama-cpp-python>=0.3.0"],
    "onnx": ["onnxruntime-gpu>=1.18"],
    # ROS 2 Kilted as pip wheels (CPython 3.11, x86-64). On a Jetson use ROS 2 from apt instead.
    "ros": [
        "ros-kilted-rclpy[fastrtps]>=9.1",
        "ros-kilted-std-msgs>=5.5",
        "ros-kilted-diagnostic-msgs>=5.5",
    ],
    "test": ["pytest>=7", "ruff>=0.5"],
    "train": ["torch>=2.0"],
}

setup(
    name=PACKAGE,
    version="0.1.0",
    description="Edge-robot control-loop latency testbed for language-model planners",
    python_requires=">=3.10",
    packages=find_packages(include=[PACKAGE, f"{PACKAGE}.*"]),
    include_package_data=True,
    package_data={PACKAGE: ["data/*", "data/**/*"]},
    data_files=[
        ("share/ament_index/resource_index/packages", [f"resource/{PACKAGE}"]),
        (f"share/{PACKAGE}", ["package.xml"]),
        (f"share/{PACKAGE}/launch", glob("launch/*.launch.py")),
        (f"share/{PACKAGE}/config", glob("config/*.yaml")),
    ],
    install_requires=INSTALL_REQUIRES,
    extras_require=EXTRAS,
    zip_safe=False,
    maintainer="robot_latency maintainers",
    maintainer_email="maintainers@robot-latency.invalid",
    license="Apache-2.0",
    tests_require=["pytest"],
    entry_points={
        "console_scripts": [
            "robot-latency = robot_latency.cli:main",
            "planner_node = robot_latency.ros.planner_node:main",
            "managed_planner_node = robot_latency.ros.managed_planner_node:main",
            "bag_replayer = robot_latency.ros.bag_replayer:main",
        ],
    },
)
