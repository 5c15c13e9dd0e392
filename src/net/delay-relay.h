// A TCP relay that delays every byte by a fixed time in each direction: a slower link on loopback, for tests,
// benchmarks and `tandem relay` (what would 1 ms more per hop do to this cluster?). This kernel has no netem,
// so the delay is done in user space: each direction has a reader that stamps what it reads and a writer that
// sends it delay_us later; throughput is not throttled (beyond the copy), only latency is added.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "core/status.h"

namespace td::net {

class DelayRelay {
public:
    // Listens on listen_host:listen_port (0: a free port) and forwards every connection to target
    // ("host:port"), delaying each direction by delay_us. Errors: bad address, port in use.
    static Result<std::unique_ptr<DelayRelay>> start(const std::string &listen_host, uint16_t listen_port,
                                                     const std::string &target, int64_t delay_us);
    ~DelayRelay();  // stops: closes the listener and every relayed connection
    uint16_t port() const;
    std::string address() const;  // "host:port" it listens on
    void stop();
    // Changes the delay for bytes read from now on (the test moves a link's latency mid-run).
    void set_delay_us(int64_t delay_us);
    // Fault drills. cut(): breaks every connection relayed now (both ends see it reset or closed); new ones
    // are relayed as before. garble(on): every byte the target sends from now on is inverted before it is
    // passed on (a node that answers with garbage), until garble(false).
    void cut();
    void garble(bool on);

    struct Impl;

private:
    DelayRelay() = default;
    std::unique_ptr<Impl> impl_;
};

}  // namespace td::net
