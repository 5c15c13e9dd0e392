// Raw-socket helpers of the HTTP tests (test-http-core, test-http-tls): dial loopback, read with a deadline.
#pragma once

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <string>

namespace td::test {

using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point t0) {
    return std::chrono::duration<double>(Clock::now() - t0).count();
}

// A blocking TCP connection to 127.0.0.1:port.
inline int dial(int port) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr *>(&a), sizeof a), 0);
    return fd;
}

// Reads until the server closes (*closed set), `want` appears in what came, or timeout.
inline std::string read_until(int fd, double timeout_s, const std::string &want = "", bool *closed = nullptr) {
    std::string out;
    if (closed != nullptr) *closed = false;
    const auto t0 = Clock::now();
    while (seconds_since(t0) < timeout_s) {
        pollfd p{fd, POLLIN, 0};
        if (::poll(&p, 1, 20) <= 0) continue;
        char buf[4096];
        const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
        if (n <= 0) {
            if (closed != nullptr) *closed = true;
            break;
        }
        out.append(buf, static_cast<size_t>(n));
        if (!want.empty() && out.find(want) != std::string::npos) break;
    }
    return out;
}

}  // namespace td::test
