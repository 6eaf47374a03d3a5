"""ROS 2 adapters: the only code in the package that imports rclpy."""
