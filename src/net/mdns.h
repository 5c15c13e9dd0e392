// mDNS / DNS-SD through Avahi: a worker announces itself as a `_tandem._tcp` service with TXT records, and a
// head browses for them. Two stacks: the Avahi daemon's client API (D-Bus) where a daemon runs, else
// avahi-core embedded in this process (its own mDNS responder on UDP 5353, which shares the port with any
// other stack). TANDEM_MDNS=daemon|embedded picks one (auto, the default: the daemon when one answers).
//
// Each announcer and each browse runs Avahi's event loop on a thread of its own; results come back under this
// module's lock. IPv4 only: a worker's address is the A record its host publishes on the interface the
// announcement arrived on.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"

namespace td::net {

inline constexpr const char *kMdnsServiceType = "_tandem._tcp";

// Whether this build has Avahi (libavahi-client-dev and libavahi-core-dev found at configure time).
bool mdns_supported();

// One resolved announcement.
struct MdnsService {
    std::string instance;  // the DNS-SD instance name ("tandem worker vm:9000")
    std::string host;      // the host name it resolved on ("vm.local")
    std::string address;   // IPv4 literal
    uint16_t port = 0;
    std::map<std::string, std::string> txt;
    std::string endpoint() const { return address + ":" + std::to_string(port); }
    std::string get(const std::string &key) const {
        auto it = txt.find(key);
        return it == txt.end() ? "" : it->second;
    }
};

class MdnsAnnouncer {
public:
    // Announces `instance` (renamed "instance #2" on a name collision) at `port`, with `txt` as its TXT
    // record, on the network interface `interface_index` (if_nametoindex), or on every one with -1. Errors:
    // no Avahi in this build, or the stack could not start (the daemon refused, no socket for UDP 5353).
    static Result<std::unique_ptr<MdnsAnnouncer>> start(const std::string &instance, uint16_t port,
                                                        const std::map<std::string, std::string> &txt,
                                                        int interface_index = -1);
    virtual ~MdnsAnnouncer() = default;  // withdraws the announcement
    // "avahi-daemon" or "embedded avahi-core".
    virtual std::string stack() const = 0;
    // The name in use (after any collision), "" until registered.
    virtual std::string instance() const = 0;
    // Blocks until the announcement is registered (probed without conflict) or `timeout`; false on timeout or
    // failure.
    virtual bool wait_registered(std::chrono::milliseconds timeout) = 0;
};

// The index of the interface that holds IPv4 address `address` ("10.0.0.2"); -1 when none does.
int interface_of_address(const std::string &address);

// Browses for kMdnsServiceType for up to `timeout`, resolving each instance. An instance seen on several
// interfaces (a host on two networks, or its loopback) is one service, at its first address that is not
// loopback. `enough` sees every resolved
// service so far whenever the set changes; browsing ends early when it returns true. Returns the services
// found, sorted by address and port. Errors: no Avahi in this build, or no stack could start.
Result<std::vector<MdnsService>> mdns_browse(
    std::chrono::milliseconds timeout, const std::function<bool(const std::vector<MdnsService> &)> &enough);

}  // namespace td::net
