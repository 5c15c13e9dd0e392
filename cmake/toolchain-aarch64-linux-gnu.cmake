# Cross-compiles tandem for 64-bit ARM Linux on an x86-64 Debian 12 host, to check that it builds on ARM and
# to run its tests (the NEON kernels included) under qemu. Needs: dpkg --add-architecture arm64, then
# g++-aarch64-linux-gnu qemu-user and the arm64 -dev packages (libfmt-dev:arm64 libgtest-dev:arm64
# libxxhash-dev:arm64 libcpp-httplib-dev:arm64).
#   cmake -G Ninja -B build/arm64 -DCMAKE_BUILD_TYPE=Release \
#         -DCMAKE_TOOLCHAIN_FILE=cmake/toolchain-aarch64-linux-gnu.cmake
#   cmake --build build/arm64 && ctest --test-dir build/arm64 -R Kernels
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(ENV{PKG_CONFIG_LIBDIR} /usr/lib/aarch64-linux-gnu/pkgconfig:/usr/share/pkgconfig)
# Test binaries (and gtest's test discovery) run through qemu, started by the arm64 loader itself: with
# qemu-user 7.2's `-L sysroot` instead, the first thread a dynamically linked program creates hangs.
set(CMAKE_CROSSCOMPILING_EMULATOR
    qemu-aarch64;/usr/aarch64-linux-gnu/lib/ld-linux-aarch64.so.1;--library-path;/usr/aarch64-linux-gnu/lib:/usr/lib/aarch64-linux-gnu)
