// `tandem doctor`: read-only checks of this host that decide whether a cluster runs at its speed. Each check
// reads /proc and /sys below a root (a fake tree in tests), says OK, WARN or cannot tell, and gives the exact
// command that fixes a WARN. A file that is missing or unreadable (containers, other kernels) is "cannot
// tell", never an error.
#pragma once

#include <string>
#include <vector>

namespace td::cluster {

enum class CheckStatus { ok, warn, unknown };
const char *check_status_name(CheckStatus s);  // "OK", "WARN", "cannot tell"

struct HostCheck {
    std::string name;  // "cpu governor"
    CheckStatus status = CheckStatus::unknown;
    std::string detail;  // what was found, with the numbers
    std::string fix;     // the command that fixes a WARN (may be empty)
};

struct HostCheckOptions {
    std::string root = "/";  // where proc/ and sys/ are
    // Interface that reaches the workers (MTU check); "" finds the default route's in proc/net/route.
    std::string interface;
    // Memory bandwidth: measured plain read (GB/s, 0: not measured) and the CPU's model name it is judged by.
    double read_gbps = 0.0;
    std::string cpu_model;
    // The cluster secret this host would use (--secret-file or its default); "": not checked.
    std::string secret_path;
};

std::vector<HostCheck> run_host_checks(const HostCheckOptions &options);

// The interface whose address this host would use to reach `host` (an IPv4/IPv6 literal or name), "" when
// unknown. Sends nothing (a UDP socket's connect only picks the route).
std::string interface_towards(const std::string &host);

// Expected plain-read bandwidth (GB/s, all cores) of known machine kinds by CPU model name; 0 when unknown.
double expected_read_gbps(const std::string &cpu_model);

}  // namespace td::cluster
