# Cross build for 64-bit ARM Linux (scripts/build_aarch64.sh) with Debian's cross tool chain
# (g++-aarch64-linux-gnu) and the arm64 -dev packages installed side by side (dpkg multiarch).
# Built programs run under qemu-aarch64 (scripts/test_aarch64.sh), which is also how CMake runs
# them at build time (gtest test discovery).
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64)
# Libraries of the target architecture only; headers are shared.
set(CMAKE_IGNORE_PATH /usr/lib/x86_64-linux-gnu /usr/lib/x86_64-linux-gnu/cmake)
