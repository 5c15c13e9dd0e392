#include "cluster/host-check.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <string_view>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "net/auth.h"
#include "net/transport.h"

namespace td::cluster {
namespace {

namespace fs = std::filesystem;

// The first line of a file, trimmed; false when it cannot be read.
bool read_line(const fs::path &p, std::string *out) {
    std::ifstream in(p);
    if (!in) return false;
    std::string s;
    std::getline(in, s);
    while (!s.empty() && (s.back() == '\n' || s.back() == ' ' || s.back() == '\r')) s.pop_back();
    *out = s;
    return true;
}

bool read_u64(const fs::path &p, uint64_t *out) {
    std::string s;
    if (!read_line(p, &s)) return false;
    try {
        size_t used = 0;
        *out = std::stoull(s, &used);
        return used > 0;
    } catch (...) {
        return false;
    }
}

std::vector<uint64_t> numbers(const std::string &s) {
    std::vector<uint64_t> v;
    std::stringstream ss(s);
    uint64_t x = 0;
    while (ss >> x) v.push_back(x);
    return v;
}

std::vector<fs::path> cpu_dirs(const fs::path &root) {
    std::vector<fs::path> out;
    std::error_code ec;
    for (const auto &e : fs::directory_iterator(root / "sys/devices/system/cpu", ec)) {
        const std::string n = e.path().filename().string();
        if (n.size() > 3 && n.compare(0, 3, "cpu") == 0 && std::all_of(n.begin() + 3, n.end(), ::isdigit))
            out.push_back(e.path());
    }
    std::sort(out.begin(), out.end());
    return out;
}

// The common tail of a check: OK, or WARN with why it matters appended to the finding and the fix.
HostCheck &verdict(HostCheck &c, bool ok, std::string_view why, std::string fix) {
    c.status = ok ? CheckStatus::ok : CheckStatus::warn;
    if (!ok) {
        c.detail += fmt::format(": {}", why);
        c.fix = std::move(fix);
    }
    return c;
}

HostCheck check_governor(const fs::path &root) {
    HostCheck c{"cpu governor", CheckStatus::unknown, "", ""};
    std::map<std::string, int> seen;
    for (const fs::path &d : cpu_dirs(root)) {
        std::string g;
        if (read_line(d / "cpufreq/scaling_governor", &g)) seen[g] += 1;
    }
    if (seen.empty()) {
        c.detail = "no cpufreq governor is exposed (a VM or container: the host decides)";
        return c;
    }
    std::string list;
    for (const auto &[g, n] : seen) list += fmt::format("{}{} on {} cpus", list.empty() ? "" : ", ", g, n);
    c.detail = list;
    return verdict(c, seen.size() == 1 && seen.count("performance"),
                   "cores that clock down between tokens answer all-reduces late",
                   "sudo cpupower frequency-set -g performance");
}

HostCheck check_cstates(const fs::path &root) {
    HostCheck c{"deep C-states", CheckStatus::unknown, "", ""};
    const fs::path d = root / "sys/devices/system/cpu/cpu0/cpuidle";
    std::error_code ec;
    if (!fs::exists(d, ec)) {
        c.detail = "no cpuidle states are exposed";
        return c;
    }
    std::vector<std::string> deep;
    int states = 0;
    for (int i = 0; i < 32; ++i) {
        const fs::path s = d / fmt::format("state{}", i);
        std::string name;
        uint64_t latency = 0, disabled = 0;
        if (!read_line(s / "name", &name) || !read_u64(s / "latency", &latency)) break;
        ++states;
        (void)read_u64(s / "disable", &disabled);
        if (latency > 10 && disabled == 0) deep.push_back(fmt::format("{} ({} µs exit)", name, latency));
    }
    if (states == 0) {
        c.detail = "no cpuidle states are readable";
        return c;
    }
    if (deep.empty()) {
        c.status = CheckStatus::ok;
        c.detail = fmt::format("{} idle states, none enabled with an exit latency over 10 µs", states);
        return c;
    }
    c.status = CheckStatus::warn;
    std::string list;
    for (const auto &s : deep) list += (list.empty() ? "" : ", ") + s;
    c.detail = "enabled: " + list + "; a core that sleeps this deep adds its exit latency to every wake-up";
    c.fix = "sudo cpupower idle-set -D 10";
    return c;
}

HostCheck check_sysctl_min(const fs::path &root, const char *name, const char *key, uint64_t want) {
    HostCheck c{name, CheckStatus::unknown, "", ""};
    uint64_t v = 0;
    if (!read_u64(root / "proc/sys" / key, &v)) {
        c.detail = fmt::format("{} is not readable", key);
        return c;
    }
    std::string dotted = key;
    std::replace(dotted.begin(), dotted.end(), '/', '.');
    c.status = v >= want ? CheckStatus::ok : CheckStatus::warn;
    c.detail = fmt::format(
        "{} = {}{}", dotted, v,
        v >= want ? "" : fmt::format(": tandem asks for {} byte socket buffers and gets at most this", want));
    if (v < want) c.fix = fmt::format("sudo sysctl -w {}={}", dotted, 4 * want);
    return c;
}

HostCheck check_tcp_mem(const fs::path &root, const char *name, const char *key, uint64_t want) {
    HostCheck c{name, CheckStatus::unknown, "", ""};
    std::string s;
    std::vector<uint64_t> v;
    if (!read_line(root / "proc/sys" / key, &s) || (v = numbers(s)).size() != 3) {
        c.detail = fmt::format("{} is not readable", key);
        return c;
    }
    std::string dotted = key;
    std::replace(dotted.begin(), dotted.end(), '/', '.');
    c.status = v[2] >= want ? CheckStatus::ok : CheckStatus::warn;
    c.detail = fmt::format("{} = {} {} {} (min default max)", dotted, v[0], v[1], v[2]);
    if (v[2] < want) c.fix = fmt::format("sudo sysctl -w {}=\"{} {} {}\"", dotted, v[0], v[1], 4 * want);
    return c;
}

HostCheck check_slow_start(const fs::path &root) {
    HostCheck c{"tcp slow start after idle", CheckStatus::unknown, "", ""};
    uint64_t v = 0;
    if (!read_u64(root / "proc/sys/net/ipv4/tcp_slow_start_after_idle", &v)) {
        c.detail = "net.ipv4.tcp_slow_start_after_idle is not readable";
        return c;
    }
    c.detail = fmt::format("net.ipv4.tcp_slow_start_after_idle = {}", v);
    return verdict(c, v == 0, "a link idle between requests restarts from a small window",
                   "sudo sysctl -w net.ipv4.tcp_slow_start_after_idle=0");
}

// proc/net/route: "Iface Destination Gateway ..." with hex fields; the default route has destination 0.
std::string default_route_interface(const fs::path &root) {
    std::ifstream in(root / "proc/net/route");
    std::string line;
    std::getline(in, line);  // header
    while (std::getline(in, line)) {
        std::stringstream ss(line);
        std::string iface, dest;
        if (ss >> iface >> dest && dest == "00000000") return iface;
    }
    return "";
}

HostCheck check_mtu(const fs::path &root, const std::string &given) {
    HostCheck c{"MTU", CheckStatus::unknown, "", ""};
    const std::string iface = given.empty() ? default_route_interface(root) : given;
    if (iface.empty()) {
        c.detail = "no interface to the workers found (give --workers, or no default route)";
        return c;
    }
    uint64_t mtu = 0, speed = 0;
    if (!read_u64(root / "sys/class/net" / iface / "mtu", &mtu)) {
        c.detail = fmt::format("{}: the MTU is not readable", iface);
        return c;
    }
    std::string speed_text;  // Mb/s; "-1" or unreadable where the driver does not know (virtual NICs)
    const bool has_speed = read_line(root / "sys/class/net" / iface / "speed", &speed_text) &&
                           !speed_text.empty() && speed_text[0] != '-' &&
                           read_u64(root / "sys/class/net" / iface / "speed", &speed);
    c.detail = fmt::format("{}: MTU {}{}", iface, mtu, has_speed ? fmt::format(", {} Mb/s", speed) : "");
    if (iface == "lo" || mtu >= 9000 || !has_speed || speed < 10000) {
        c.status = CheckStatus::ok;
        if (mtu < 9000 && iface != "lo") c.detail += " (jumbo frames matter from 10 Gb/s up)";
        return c;
    }
    c.status = CheckStatus::warn;
    c.detail +=
        ": a 10+ Gb/s link with standard frames spends its CPU on per-packet work for large activations";
    c.fix = fmt::format("sudo ip link set dev {} mtu 9000   # on every node and the switch", iface);
    return c;
}

HostCheck check_irq(const fs::path &root) {
    HostCheck c{"interrupts and isolated cores", CheckStatus::unknown, "", ""};
    std::string isolated, def;
    const bool has_iso = read_line(root / "sys/devices/system/cpu/isolated", &isolated);
    const bool has_def = read_line(root / "proc/irq/default_smp_affinity", &def);
    bool irqbalance = false;
    std::error_code ec;
    for (const auto &e : fs::directory_iterator(root / "proc", ec)) {
        const std::string n = e.path().filename().string();
        if (n.empty() || !std::all_of(n.begin(), n.end(), ::isdigit)) continue;
        std::string comm;
        if (read_line(e.path() / "comm", &comm) && comm == "irqbalance") irqbalance = true;
    }
    if (!has_iso && !has_def) {
        c.detail = "neither the isolated cores nor the default interrupt affinity is readable";
        return c;
    }
    c.detail = fmt::format("isolated cores: {}; default interrupt affinity: {}; irqbalance {}",
                           isolated.empty() ? "none" : isolated, has_def ? def : "?",
                           irqbalance ? "runs" : "does not run");
    return verdict(c, isolated.empty() || !irqbalance,
                   "irqbalance may move network interrupts onto the isolated compute cores",
                   fmt::format("sudo sh -c 'echo IRQBALANCE_BANNED_CPULIST={} >> /etc/default/irqbalance' && "
                               "sudo systemctl restart irqbalance",
                               isolated));
}

HostCheck check_thp(const fs::path &root) {
    HostCheck c{"transparent huge pages", CheckStatus::unknown, "", ""};
    std::string s;
    if (!read_line(root / "sys/kernel/mm/transparent_hugepage/enabled", &s)) {
        c.detail = "not readable";
        return c;
    }
    const size_t a = s.find('['), b = s.find(']');
    const std::string mode =
        a != std::string::npos && b != std::string::npos && b > a ? s.substr(a + 1, b - a - 1) : s;
    c.detail = "mode " + mode;
    return verdict(c, mode == "always" || mode == "madvise",
                   "weights and buffers stay on 4 KiB pages (more TLB misses while streaming weights)",
                   "echo madvise | sudo tee /sys/kernel/mm/transparent_hugepage/enabled");
}

HostCheck check_memlock(const fs::path &root) {
    HostCheck c{"locked-memory limit", CheckStatus::unknown, "", ""};
    std::ifstream in(root / "proc/self/limits");
    std::string line;
    while (std::getline(in, line)) {
        if (line.compare(0, 17, "Max locked memory") != 0) continue;
        std::stringstream ss(line.substr(17));
        std::string soft, hard;
        ss >> soft >> hard;
        c.detail = fmt::format("soft {}, hard {} (bytes)", soft, hard);
        if (soft == "unlimited") {
            c.status = CheckStatus::ok;
        } else {
            uint64_t v = 0;
            try {
                v = std::stoull(soft);
            } catch (...) {
                return c;
            }
            if (v < (uint64_t{1} << 30) && !fs::exists(root / "sys/class/infiniband")) {
                c.status = CheckStatus::ok;  // only RDMA locks buffers, and this host has no RDMA device
                c.detail += " (no RDMA device here: only RDMA needs locked memory)";
                return c;
            }
            verdict(c, v >= (uint64_t{1} << 30), "RDMA registers activation buffers and needs them locked",
                    "ulimit -l unlimited   # for good: '* - memlock unlimited' in /etc/security/limits.conf");
        }
        return c;
    }
    c.detail = "proc/self/limits has no locked-memory line";
    return c;
}

// RDMA NICs (what UCX would use between hosts): each device's ports from sys/class/infiniband. A port must be
// ACTIVE; a RoCE port (link layer Ethernet) also needs a RoCE v2 GID (the interface has an IP address) and
// its interface an MTU that carries 4096-byte RDMA packets (>= 4200 with the RoCE headers; 1500 drops the
// RDMA MTU to 1024). OK when one port is ready; no device at all is OK too (nothing to check: TCP or shm
// links).
HostCheck check_rdma(const fs::path &root) {
    HostCheck c{"RDMA", CheckStatus::unknown, "", ""};
    const fs::path dir = root / "sys/class/infiniband";
    std::error_code ec;
    if (!fs::exists(root / "sys/class", ec)) {
        c.detail = "sys/class is not readable";
        return c;
    }
    if (!fs::exists(dir, ec)) {
        c.status = CheckStatus::ok;
        c.detail = "no RDMA device (links take TCP, or shared memory within a host)";
        return c;
    }
    std::vector<std::string> ready, problems, fixes, unreadable;
    std::vector<fs::path> devices;
    for (const auto &e : fs::directory_iterator(dir, ec)) devices.push_back(e.path());
    std::sort(devices.begin(), devices.end());
    for (const fs::path &dev : devices) {
        const std::string name = dev.filename().string();
        std::vector<fs::path> ports;
        for (const auto &e : fs::directory_iterator(dev / "ports", ec)) ports.push_back(e.path());
        std::sort(ports.begin(), ports.end());
        for (const fs::path &port : ports) {
            const std::string where = fmt::format("{} port {}", name, port.filename().string());
            std::string state, layer;
            if (!read_line(port / "state", &state) || !read_line(port / "link_layer", &layer)) {
                unreadable.push_back(where + ": state or link layer not readable");
                continue;
            }
            if (state.find("ACTIVE") == std::string::npos) {
                problems.push_back(fmt::format("{}: {}", where, state));
                fixes.push_back(
                    fmt::format("ibv_devinfo -d {}   # then check the cable and the switch port", name));
                continue;
            }
            if (layer != "Ethernet") {  // InfiniBand: an active port is all UCX needs
                ready.push_back(fmt::format("{}: ACTIVE, {}", where, layer));
                continue;
            }
            // RoCE: the first v2 GID that is set, and the interface it belongs to.
            std::string netdev;
            int gid_index = -1;
            std::vector<fs::path> gids;
            for (const auto &e : fs::directory_iterator(port / "gid_attrs/types", ec))
                gids.push_back(e.path());
            std::sort(gids.begin(), gids.end(), [](const fs::path &a, const fs::path &b) {
                return std::atoi(a.filename().c_str()) < std::atoi(b.filename().c_str());
            });
            for (const fs::path &g : gids) {
                std::string type, gid;
                const std::string idx = g.filename().string();
                if (!read_line(g, &type) || type.find("v2") == std::string::npos) continue;
                if (!read_line(port / "gids" / idx, &gid) || gid.find_first_not_of("0:") == std::string::npos)
                    continue;
                gid_index = std::atoi(idx.c_str());
                (void)read_line(port / "gid_attrs/ndevs" / idx, &netdev);
                break;
            }
            if (gid_index < 0) {
                problems.push_back(where + ": ACTIVE RoCE port without a RoCE v2 GID");
                fixes.push_back(
                    fmt::format("give {}'s interface an IP address (rdma link show; ip addr add ...)", name));
                continue;
            }
            uint64_t mtu = 0;
            if (netdev.empty() || !read_u64(root / "sys/class/net" / netdev / "mtu", &mtu)) {
                unreadable.push_back(
                    fmt::format("{}: RoCE v2 GID {}, interface MTU not readable", where, gid_index));
                continue;
            }
            if (mtu < 4200) {
                problems.push_back(
                    fmt::format("{}: RoCE v2 GID {} on {}, MTU {} (RDMA packets of 1024 bytes)", where,
                                gid_index, netdev, mtu));
                fixes.push_back(fmt::format("sudo ip link set {} mtu 9000   # and the switch ports", netdev));
                continue;
            }
            ready.push_back(
                fmt::format("{}: ACTIVE, RoCE v2 GID {} on {} (MTU {})", where, gid_index, netdev, mtu));
        }
    }
    std::string detail;
    for (const auto *list : {&ready, &problems, &unreadable})
        for (const std::string &x : *list) detail += (detail.empty() ? "" : "; ") + x;
    c.detail = detail.empty() ? "sys/class/infiniband lists no device with ports" : detail;
    if (ready.empty() && problems.empty()) return c;  // cannot tell
    std::string fix;
    for (const std::string &f : fixes) fix += (fix.empty() ? "" : " && ") + f;
    if (!ready.empty()) {
        c.status = CheckStatus::ok;  // UCX takes the ready port; the others are listed
        return c;
    }
    return verdict(c, false, "no RDMA port UCX could use at full speed", fix);
}

HostCheck check_swap(const fs::path &root) {
    HostCheck c{"swap", CheckStatus::unknown, "", ""};
    std::ifstream in(root / "proc/meminfo");
    std::string key, unit;
    uint64_t kb = 0, total = 0, free = 0;
    bool have_total = false, have_free = false;
    while (in >> key >> kb) {
        std::getline(in, unit);
        if (key == "SwapTotal:") total = kb, have_total = true;
        if (key == "SwapFree:") free = kb, have_free = true;
    }
    if (!have_total || !have_free) {
        c.detail = "proc/meminfo has no swap lines";
        return c;
    }
    uint64_t swappiness = 0;
    const bool has_sw = read_u64(root / "proc/sys/vm/swappiness", &swappiness);
    c.detail = fmt::format("{:.1f} GiB of swap, {:.1f} GiB used{}", total / 1048576.0,
                           (total - std::min(total, free)) / 1048576.0,
                           has_sw ? fmt::format(", vm.swappiness = {}", swappiness) : "");
    return verdict(c, total == 0 || (has_sw && swappiness <= 10 && total == free),
                   "weights paged out to swap stall a token for milliseconds",
                   "sudo sysctl -w vm.swappiness=1   # or: sudo swapoff -a");
}

HostCheck check_numa(const fs::path &root) {
    HostCheck c{"NUMA", CheckStatus::unknown, "", ""};
    int nodes = 0;
    std::error_code ec;
    for (const auto &e : fs::directory_iterator(root / "sys/devices/system/node", ec)) {
        const std::string n = e.path().filename().string();
        if (n.size() > 4 && n.compare(0, 4, "node") == 0 && std::all_of(n.begin() + 4, n.end(), ::isdigit))
            ++nodes;
    }
    if (nodes == 0) {
        c.detail = "no NUMA nodes are exposed";
        return c;
    }
    c.detail = fmt::format("{} NUMA node{}", nodes, nodes == 1 ? "" : "s");
    return verdict(c, nodes == 1, "one process across nodes reads half its weights over the socket link",
                   "numactl --cpunodebind=0 --membind=0 tandem worker ...   # one worker per NUMA node");
}

}  // namespace

const char *check_status_name(CheckStatus s) {
    switch (s) {
        case CheckStatus::ok:
            return "OK";
        case CheckStatus::warn:
            return "WARN";
        case CheckStatus::unknown:
            return "cannot tell";
    }
    return "cannot tell";
}

double expected_read_gbps(const std::string &cpu) {
    // Plain-read figures a healthy machine of each kind reaches with all cores (about 80% of the memory's
    // theoretical rate): Strix Halo's 256-bit LPDDR5X-8000 is 256 GB/s; desktop dual-channel DDR5-5600 is 90.
    struct Kind {
        const char *match;
        double gbps;
    };
    static const Kind kinds[] = {
        {"Ryzen AI Max", 200.0}, {"Ryzen 9 9950X", 70.0},      {"Ryzen 9 7950X", 70.0},
        {"Ryzen 7 7700", 65.0},  {"Core(TM) i9-14900K", 75.0}, {"Core(TM) i9-13900K", 75.0},
    };
    auto lower = [](std::string s) {
        for (char &c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
        return s;
    };
    const std::string name = lower(cpu);  // "AMD RYZEN AI MAX+ 395 w/ Radeon 8060S"
    for (const Kind &k : kinds)
        if (name.find(lower(k.match)) != std::string::npos) return k.gbps;
    return 0.0;
}

std::string interface_towards(const std::string &host) {
    addrinfo hints{};
    hints.ai_socktype = SOCK_DGRAM;
    addrinfo *res = nullptr;
    if (getaddrinfo(host.c_str(), "9", &hints, &res) != 0 || res == nullptr) return "";
    std::string out;
    const int fd = socket(res->ai_family, SOCK_DGRAM, 0);
    sockaddr_storage local{};
    socklen_t len = sizeof local;
    if (fd >= 0 && connect(fd, res->ai_addr, res->ai_addrlen) == 0 &&
        getsockname(fd, reinterpret_cast<sockaddr *>(&local), &len) == 0) {
        ifaddrs *ifs = nullptr;
        if (getifaddrs(&ifs) == 0) {
            for (ifaddrs *i = ifs; i != nullptr; i = i->ifa_next) {
                if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != local.ss_family) continue;
                const bool same =
                    local.ss_family == AF_INET
                        ? reinterpret_cast<sockaddr_in *>(i->ifa_addr)->sin_addr.s_addr ==
                              reinterpret_cast<sockaddr_in *>(&local)->sin_addr.s_addr
                        : std::memcmp(&reinterpret_cast<sockaddr_in6 *>(i->ifa_addr)->sin6_addr,
                                      &reinterpret_cast<sockaddr_in6 *>(&local)->sin6_addr, 16) == 0;
                if (same) {
                    out = i->ifa_name;
                    break;
                }
            }
            freeifaddrs(ifs);
        }
    }
    if (fd >= 0) close(fd);
    freeaddrinfo(res);
    return out;
}

HostCheck check_secret(const std::string &path) {
    HostCheck c{"cluster secret", CheckStatus::unknown, "not checked", ""};
    if (path.empty()) return c;
    auto s = net::ClusterSecret::load(path);
    if (s.ok()) {
        c.status = CheckStatus::ok;
        c.detail = fmt::format("{} (owner only)", path);
        return c;
    }
    c.status = CheckStatus::warn;
    c.detail = s.status().message();
    if (s.status().kind() == ErrorKind::not_found)
        c.fix = fmt::format("start `tandem worker` once (it creates {}), then copy that file to every node", path);
    else if (c.detail.find("chmod") != std::string::npos)
        c.fix = fmt::format("chmod 600 {}", path);
    else
        c.fix = fmt::format("put at least {} random characters in {} (or delete it and start `tandem worker`)",
                            net::kMinSecretBytes, path);
    return c;
}

std::vector<HostCheck> run_host_checks(const HostCheckOptions &o) {
    const fs::path root(o.root.empty() ? "/" : o.root);
    const uint64_t want = static_cast<uint64_t>(net::kTcpSocketBufferBytes);
    std::vector<HostCheck> out;
    out.push_back(check_governor(root));
    out.push_back(check_cstates(root));
    out.push_back(check_sysctl_min(root, "socket receive buffer limit", "net/core/rmem_max", want));
    out.push_back(check_sysctl_min(root, "socket send buffer limit", "net/core/wmem_max", want));
    out.push_back(check_tcp_mem(root, "tcp receive buffers", "net/ipv4/tcp_rmem", want));
    out.push_back(check_tcp_mem(root, "tcp send buffers", "net/ipv4/tcp_wmem", want));
    out.push_back(check_slow_start(root));
    out.push_back(check_mtu(root, o.interface));
    out.push_back(check_irq(root));
    out.push_back(check_thp(root));
    out.push_back(check_memlock(root));
    out.push_back(check_rdma(root));
    out.push_back(check_swap(root));
    out.push_back(check_numa(root));
    HostCheck bw{"memory bandwidth", CheckStatus::unknown, "", ""};
    if (o.read_gbps > 0) {
        const double want_bw = expected_read_gbps(o.cpu_model);
        bw.detail = fmt::format("plain read {:.1f} GB/s on all cores", o.read_gbps);
        if (want_bw > 0) {
            bw.detail += fmt::format("; a healthy {} reads about {:.0f} GB/s", o.cpu_model, want_bw);
            verdict(bw, o.read_gbps >= 0.6 * want_bw,
                    "memory in fewer channels, a low memory clock, or another process reading",
                    "check the DIMMs/BIOS memory profile (sudo dmidecode -t memory) and what else runs (top)");
        } else {
            bw.detail += fmt::format(" (no reference figure for '{}')",
                                     o.cpu_model.empty() ? "this cpu" : o.cpu_model);
        }
    } else {
        bw.detail = "not measured";
    }
    out.push_back(bw);
    out.push_back(check_secret(o.secret_path));
    return out;
}

}  // namespace td::cluster
