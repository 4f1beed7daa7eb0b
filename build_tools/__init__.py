"""Build driver for the native core: backend detection, the hipify stage and CMake."""
