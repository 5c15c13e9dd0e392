#include "net/mdns.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>

#include <algorithm>
#include <cctype>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <string_view>

#include "core/log.h"

#ifdef TD_HAVE_AVAHI
#include <avahi-client/client.h>
#include <avahi-client/lookup.h>
#include <avahi-client/publish.h>
#include <avahi-common/alternative.h>
#include <avahi-common/error.h>
#include <avahi-common/malloc.h>
#include <avahi-common/strlst.h>
#include <avahi-common/thread-watch.h>
#include <avahi-core/core.h>
#include <avahi-core/log.h>
#include <avahi-core/lookup.h>
#include <avahi-core/publish.h>
#include <unistd.h>
#endif

namespace td::net {

int interface_of_address(const std::string &address) {
    in_addr want{};
    if (inet_pton(AF_INET, address.c_str(), &want) != 1) return -1;
    ifaddrs *list = nullptr;
    if (getifaddrs(&list) != 0) return -1;
    int index = -1;
    for (ifaddrs *i = list; i != nullptr && index < 0; i = i->ifa_next)
        if (i->ifa_addr != nullptr && i->ifa_addr->sa_family == AF_INET &&
            reinterpret_cast<sockaddr_in *>(i->ifa_addr)->sin_addr.s_addr == want.s_addr)
            index = static_cast<int>(if_nametoindex(i->ifa_name));
    freeifaddrs(list);
    return index;
}

#ifndef TD_HAVE_AVAHI

bool mdns_supported() {
    return false;
}

Result<std::unique_ptr<MdnsAnnouncer>> MdnsAnnouncer::start(const std::string &, uint16_t,
                                                            const std::map<std::string, std::string> &, int) {
    return make_error(ErrorKind::unimplemented,
                      "this build has no mDNS (Avahi's development packages were missing)");
}

Result<std::vector<MdnsService>> mdns_browse(std::chrono::milliseconds,
                                             const std::function<bool(const std::vector<MdnsService> &)> &) {
    return make_error(ErrorKind::unimplemented,
                      "this build has no mDNS (Avahi's development packages were missing)");
}

#else

bool mdns_supported() {
    return true;
}

namespace {

enum class StackChoice { automatic, daemon, embedded };

StackChoice stack_choice() {
    const char *env = std::getenv("TANDEM_MDNS");
    const std::string_view v = env == nullptr ? "" : env;
    if (v == "daemon") return StackChoice::daemon;
    if (v == "embedded") return StackChoice::embedded;
    return StackChoice::automatic;
}

// avahi-core's own messages ("Joining mDNS multicast group ...") at debug level, its warnings as warnings.
void avahi_to_log(AvahiLogLevel level, const char *text) {
    if (level <= AVAHI_LOG_WARN)
        log_warn("mdns: {}", text);
    else
        log_debug("mdns: {}", text);
}

AvahiStringList *to_strlst(const std::map<std::string, std::string> &txt) {
    AvahiStringList *l = nullptr;
    for (const auto &[k, v] : txt) l = avahi_string_list_add_pair(l, k.c_str(), v.c_str());
    return l;
}

std::map<std::string, std::string> from_strlst(AvahiStringList *l) {
    std::map<std::string, std::string> out;
    for (; l != nullptr; l = avahi_string_list_get_next(l)) {
        char *key = nullptr, *value = nullptr;
        if (avahi_string_list_get_pair(l, &key, &value, nullptr) != 0) continue;
        out[key] = value == nullptr ? "" : value;
        avahi_free(key);
        avahi_free(value);
    }
    return out;
}

// A host name for an embedded responder: this host's first label, made a valid DNS label. Every embedded
// responder of one host uses the same name and so publishes the same address records, which do not conflict
// (a name per process did: their reverse PTR records for one address fought forever).
std::string embedded_host_name() {
    char host[256] = {};
    gethostname(host, sizeof(host) - 1);
    std::string out;
    for (const char *p = host; *p != 0 && *p != '.'; ++p) {
        const char c = *p;
        out += (std::isalnum(static_cast<unsigned char>(c)) || c == '-') ? c : '-';
    }
    if (out.empty()) out = "tandem-host";
    return out.substr(0, 63);
}

// One Avahi stack on its own event-loop thread: the daemon's client, or an embedded avahi-core server.
// Callbacks run on that thread; other threads take lock() first.
class Stack {
public:
    // A stack whose first state change (running, or failed) calls `on_state` on the loop thread.
    static Result<std::unique_ptr<Stack>> open(bool publish,
                                               std::function<void(Stack &, bool running)> on_state) {
        std::unique_ptr<Stack> s(new Stack());
        s->on_state_ = std::move(on_state);
        s->poll_ = avahi_threaded_poll_new();
        if (s->poll_ == nullptr)
            return make_error(ErrorKind::failed, "mdns: cannot start Avahi's event loop");
        const StackChoice choice = stack_choice();
        int error = 0;
        if (choice != StackChoice::embedded) {
            s->client_ = avahi_client_new(avahi_threaded_poll_get(s->poll_), AVAHI_CLIENT_IGNORE_USER_CONFIG,
                                          &Stack::client_cb, s.get(), &error);
            s->client_ready_ = s->client_ != nullptr;  // a failure inside avahi_client_new freed what it made
            if (s->client_ == nullptr && choice == StackChoice::daemon)
                return make_error(ErrorKind::io, "mdns: the Avahi daemon does not answer: {}",
                                  avahi_strerror(error));
        }
        if (!s->client_ready_) {
            s->client_ = nullptr;
            avahi_set_log_function(avahi_to_log);
            AvahiServerConfig config;
            avahi_server_config_init(&config);
            config.use_ipv6 = 0;
            config.publish_hinfo = 0;
            config.publish_workstation = 0;
            config.publish_domain = 0;
            config.publish_addresses = publish ? 1 : 0;
            config.disable_publishing = publish ? 0 : 1;
            const std::string host = embedded_host_name();
            config.host_name = avahi_strdup(host.c_str());
            s->server_ = avahi_server_new(avahi_threaded_poll_get(s->poll_), &config, &Stack::server_cb,
                                          s.get(), &error);
            avahi_server_config_free(&config);
            if (s->server_ == nullptr)
                return make_error(ErrorKind::io,
                                  "mdns: cannot start an embedded mDNS responder (UDP 5353): {}",
                                  avahi_strerror(error));
        }
        if (avahi_threaded_poll_start(s->poll_) < 0)
            return make_error(ErrorKind::failed, "mdns: cannot start Avahi's event loop thread");
        s->started_ = true;
        return s;
    }

    ~Stack() {
        if (poll_ != nullptr && started_) avahi_threaded_poll_stop(poll_);
        // The loop has stopped: what hangs off the client or server goes with it.
        if (client_ != nullptr) avahi_client_free(client_);
        if (server_ != nullptr) avahi_server_free(server_);
        if (poll_ != nullptr) avahi_threaded_poll_free(poll_);
    }

    void lock() { avahi_threaded_poll_lock(poll_); }
    void unlock() { avahi_threaded_poll_unlock(poll_); }
    bool daemon() const { return client_ != nullptr; }
    AvahiClient *client() { return client_; }
    AvahiServer *server() { return server_; }
    std::string error_text() const {
        return avahi_strerror(client_ != nullptr ? avahi_client_errno(client_) : avahi_server_errno(server_));
    }

private:
    Stack() = default;
    static void client_cb(AvahiClient *c, AvahiClientState state, void *ud) {
        auto *s = static_cast<Stack *>(ud);
        s->client_ = c;  // the first call comes from inside avahi_client_new
        if (state == AVAHI_CLIENT_S_RUNNING)
            s->on_state_(*s, true);
        else if (state == AVAHI_CLIENT_FAILURE && s->client_ready_)
            s->on_state_(*s, false);
    }
    static void server_cb(AvahiServer *srv, AvahiServerState state, void *ud) {
        auto *s = static_cast<Stack *>(ud);
        if (s->server_ == nullptr) s->server_ = srv;
        if (state == AVAHI_SERVER_RUNNING) {
            s->on_state_(*s, true);
        } else if (state == AVAHI_SERVER_COLLISION) {
            // Another host took our host name: take the next one ("vm-tandem-9000-2").
            char *n = avahi_alternative_host_name(avahi_server_get_host_name(srv));
            avahi_server_set_host_name(srv, n);
            avahi_free(n);
        } else if (state == AVAHI_SERVER_FAILURE) {
            s->on_state_(*s, false);
        }
    }

    AvahiThreadedPoll *poll_ = nullptr;
    AvahiClient *client_ = nullptr;
    AvahiServer *server_ = nullptr;
    bool client_ready_ = false;  // avahi_client_new returned it (a failure before that is not reported)
    bool started_ = false;
    std::function<void(Stack &, bool)> on_state_;
};

class AvahiAnnouncer : public MdnsAnnouncer {
public:
    AvahiAnnouncer(std::string instance, uint16_t port, std::map<std::string, std::string> txt,
                   AvahiIfIndex iface)
        : name_(std::move(instance)), port_(port), txt_(std::move(txt)), iface_(iface) {}
    ~AvahiAnnouncer() override {
        if (!stack_) return;
        stack_->lock();
        free_group();
        stack_->unlock();
        stack_.reset();
    }

    Status open() {
        // The first state may come before open() returns (the daemon's client reports "running" at once).
        TD_ASSIGN_OR_RETURN(stack_, Stack::open(true, [this](Stack &s, bool running) {
                                st_ = &s;
                                if (running)
                                    publish();
                                else
                                    fail(s.error_text());
                            }));
        return {};
    }

    std::string stack() const override {
        return stack_ && stack_->daemon() ? "avahi-daemon" : "embedded avahi-core";
    }
    std::string instance() const override {
        std::lock_guard lock(mu_);
        return registered_ ? name_ : "";
    }
    bool wait_registered(std::chrono::milliseconds timeout) override {
        std::unique_lock lock(mu_);
        cv_.wait_for(lock, timeout, [&] { return registered_ || failed_; });
        return registered_;
    }

private:
    // On the loop thread: (re)builds the entry group with the current name and commits it.
    void publish() {
        free_group();
        AvahiStringList *txt = to_strlst(txt_);
        std::string name;
        {
            std::lock_guard lock(mu_);
            name = name_;
        }
        int rc = 0;
        if (st_->daemon()) {
            cgroup_ = avahi_entry_group_new(st_->client(), &AvahiAnnouncer::client_group_cb, this);
            rc = cgroup_ == nullptr
                     ? -1
                     : avahi_entry_group_add_service_strlst(cgroup_, iface_, AVAHI_PROTO_INET,
                                                            static_cast<AvahiPublishFlags>(0), name.c_str(),
                                                            kMdnsServiceType, nullptr, nullptr, port_, txt);
            if (rc == 0) rc = avahi_entry_group_commit(cgroup_);
        } else {
            sgroup_ = avahi_s_entry_group_new(st_->server(), &AvahiAnnouncer::server_group_cb, this);
            rc = sgroup_ == nullptr
                     ? -1
                     : avahi_server_add_service_strlst(st_->server(), sgroup_, iface_, AVAHI_PROTO_INET,
                                                       static_cast<AvahiPublishFlags>(0), name.c_str(),
                                                       kMdnsServiceType, nullptr, nullptr, port_, txt);
            if (rc == 0) rc = avahi_s_entry_group_commit(sgroup_);
        }
        avahi_string_list_free(txt);
        if (rc == AVAHI_ERR_COLLISION) return rename();
        if (rc != 0) fail(avahi_strerror(rc));
    }
    void free_group() {
        if (cgroup_ != nullptr) avahi_entry_group_free(cgroup_);
        if (sgroup_ != nullptr) avahi_s_entry_group_free(sgroup_);
        cgroup_ = nullptr;
        sgroup_ = nullptr;
    }
    // The name is taken on the network: "name #2", and again.
    void rename() {
        {
            std::lock_guard lock(mu_);
            char *n = avahi_alternative_service_name(name_.c_str());
            log_info("mdns: the name '{}' is taken; announcing as '{}'", name_, n);
            name_ = n;
            avahi_free(n);
            registered_ = false;
        }
        publish();
    }
    void fail(const std::string &why) {
        std::lock_guard lock(mu_);
        log_warn("mdns: cannot announce '{}': {}", name_, why);
        failed_ = true;
        cv_.notify_all();
    }
    void on_group(AvahiEntryGroupState state) {
        if (state == AVAHI_ENTRY_GROUP_ESTABLISHED) {
            std::lock_guard lock(mu_);
            registered_ = true;
            cv_.notify_all();
        } else if (state == AVAHI_ENTRY_GROUP_COLLISION) {
            rename();
        } else if (state == AVAHI_ENTRY_GROUP_FAILURE) {
            fail(st_->error_text());
        }
    }
    static void client_group_cb(AvahiEntryGroup *, AvahiEntryGroupState state, void *ud) {
        static_cast<AvahiAnnouncer *>(ud)->on_group(state);
    }
    static void server_group_cb(AvahiServer *, AvahiSEntryGroup *, AvahiEntryGroupState state, void *ud) {
        static_cast<AvahiAnnouncer *>(ud)->on_group(state);
    }

    mutable std::mutex mu_;  // name_, registered_, failed_
    std::condition_variable cv_;
    std::string name_;
    const uint16_t port_;
    const std::map<std::string, std::string> txt_;
    const AvahiIfIndex iface_;
    bool registered_ = false;
    bool failed_ = false;
    std::unique_ptr<Stack> stack_;
    Stack *st_ = nullptr;  // the loop thread's view of stack_ (set before stack_ may be)
    AvahiEntryGroup *cgroup_ = nullptr;
    AvahiSEntryGroup *sgroup_ = nullptr;
};

// A browse: a service browser, and a resolver per instance it reports.
class Browse {
public:
    explicit Browse(std::function<bool(const std::vector<MdnsService> &)> enough)
        : enough_(std::move(enough)) {}
    ~Browse() {
        if (!stack_) return;
        stack_->lock();
        for (auto &[key, r] : cresolvers_) avahi_service_resolver_free(r);
        for (auto &[key, r] : sresolvers_) avahi_s_service_resolver_free(r);
        if (cbrowser_ != nullptr) avahi_service_browser_free(cbrowser_);
        if (sbrowser_ != nullptr) avahi_s_service_browser_free(sbrowser_);
        stack_->unlock();
        stack_.reset();
    }

    Status open() {
        TD_ASSIGN_OR_RETURN(stack_, Stack::open(false, [this](Stack &s, bool running) {
                                st_ = &s;
                                if (running)
                                    start();
                                else
                                    finish(s.error_text());
                            }));
        return {};
    }

    Result<std::vector<MdnsService>> wait(std::chrono::milliseconds timeout) {
        std::unique_lock lock(mu_);
        cv_.wait_for(lock, timeout, [&] { return done_; });
        if (!error_.empty() && found_.empty())
            return make_error(ErrorKind::io, "mdns: browsing failed: {}", error_);
        return sorted();
    }

private:
    std::vector<MdnsService> sorted() const {
        // One service per instance (found_ has it once per interface it was seen on): the first address that
        // is not loopback wins.
        std::map<std::string, MdnsService> by_instance;
        for (const auto &[key, s] : found_) {
            auto it = by_instance.find(s.instance);
            const bool loopback = s.address.rfind("127.", 0) == 0;
            if (it == by_instance.end())
                by_instance.emplace(s.instance, s);
            else if (it->second.address.rfind("127.", 0) == 0 && !loopback)
                it->second = s;
        }
        std::vector<MdnsService> out;
        for (const auto &[name, s] : by_instance) out.push_back(s);
        std::sort(out.begin(), out.end(), [](const MdnsService &a, const MdnsService &b) {
            return std::make_pair(a.address, a.port) < std::make_pair(b.address, b.port);
        });
        return out;
    }
    void start() {  // the loop thread, once the stack runs
        if (cbrowser_ != nullptr || sbrowser_ != nullptr) return;
        if (st_->daemon())
            cbrowser_ = avahi_service_browser_new(st_->client(), AVAHI_IF_UNSPEC, AVAHI_PROTO_INET,
                                                  kMdnsServiceType, nullptr, static_cast<AvahiLookupFlags>(0),
                                                  &Browse::client_browse_cb, this);
        else
            sbrowser_ = avahi_s_service_browser_new(
                st_->server(), AVAHI_IF_UNSPEC, AVAHI_PROTO_INET, kMdnsServiceType, nullptr,
                static_cast<AvahiLookupFlags>(0), &Browse::server_browse_cb, this);
        if (cbrowser_ == nullptr && sbrowser_ == nullptr) finish(st_->error_text());
    }
    static std::string key_of(int iface, const char *name) { return std::to_string(iface) + "/" + name; }
    void on_browse(AvahiIfIndex iface, AvahiProtocol proto, AvahiBrowserEvent event, const char *name,
                   const char *type, const char *domain) {
        if (event == AVAHI_BROWSER_FAILURE) return finish(st_->error_text());
        if (name == nullptr || (event != AVAHI_BROWSER_NEW && event != AVAHI_BROWSER_REMOVE))
            return;  // "all for now", "cache exhausted": nothing to do, the window decides
        const std::string key = key_of(iface, name);
        if (event == AVAHI_BROWSER_NEW) {
            if (st_->daemon()) {
                if (cresolvers_.contains(key)) return;
                AvahiServiceResolver *r = avahi_service_resolver_new(
                    st_->client(), iface, proto, name, type, domain, AVAHI_PROTO_INET,
                    static_cast<AvahiLookupFlags>(0), &Browse::client_resolve_cb, this);
                if (r != nullptr) cresolvers_[key] = r;
            } else {
                if (sresolvers_.contains(key)) return;
                AvahiSServiceResolver *r = avahi_s_service_resolver_new(
                    st_->server(), iface, proto, name, type, domain, AVAHI_PROTO_INET,
                    static_cast<AvahiLookupFlags>(0), &Browse::server_resolve_cb, this);
                if (r != nullptr) sresolvers_[key] = r;
            }
        } else if (event == AVAHI_BROWSER_REMOVE) {
            if (auto it = cresolvers_.find(key); it != cresolvers_.end()) {
                avahi_service_resolver_free(it->second);
                cresolvers_.erase(it);
            }
            if (auto it = sresolvers_.find(key); it != sresolvers_.end()) {
                avahi_s_service_resolver_free(it->second);
                sresolvers_.erase(it);
            }
            changed([&] { return found_.erase(key) > 0; });
        }
    }
    void on_resolve(AvahiIfIndex iface, AvahiResolverEvent event, const char *name, const char *host,
                    const AvahiAddress *a, uint16_t port, AvahiStringList *txt) {
        if (event != AVAHI_RESOLVER_FOUND || a == nullptr) return;  // a timeout: it may answer later
        MdnsService s;
        s.instance = name;
        s.host = host == nullptr ? "" : host;
        char addr[AVAHI_ADDRESS_STR_MAX] = {};
        avahi_address_snprint(addr, sizeof(addr), a);
        s.address = addr;
        s.port = port;
        s.txt = from_strlst(txt);
        // The resolver stays open: it reports again when the TXT record or the address changes.
        changed([&] {
            found_[key_of(iface, name)] = std::move(s);
            return true;
        });
    }
    // Applies `update` under the lock; when it changed the set, asks `enough` whether to stop.
    template <typename F>
    void changed(F &&update) {
        std::lock_guard lock(mu_);
        if (!update() || done_) return;
        if (enough_ && enough_(sorted())) {
            done_ = true;
            cv_.notify_all();
        }
    }
    void finish(const std::string &error) {
        std::lock_guard lock(mu_);
        error_ = error;
        done_ = true;
        cv_.notify_all();
    }
    static void client_browse_cb(AvahiServiceBrowser *, AvahiIfIndex iface, AvahiProtocol proto,
                                 AvahiBrowserEvent event, const char *name, const char *type,
                                 const char *domain, AvahiLookupResultFlags, void *ud) {
        static_cast<Browse *>(ud)->on_browse(iface, proto, event, name, type, domain);
    }
    static void server_browse_cb(AvahiSServiceBrowser *, AvahiIfIndex iface, AvahiProtocol proto,
                                 AvahiBrowserEvent event, const char *name, const char *type,
                                 const char *domain, AvahiLookupResultFlags, void *ud) {
        static_cast<Browse *>(ud)->on_browse(iface, proto, event, name, type, domain);
    }
    static void client_resolve_cb(AvahiServiceResolver *, AvahiIfIndex iface, AvahiProtocol,
                                  AvahiResolverEvent event, const char *name, const char *, const char *,
                                  const char *host, const AvahiAddress *a, uint16_t port,
                                  AvahiStringList *txt, AvahiLookupResultFlags, void *ud) {
        static_cast<Browse *>(ud)->on_resolve(iface, event, name, host, a, port, txt);
    }
    static void server_resolve_cb(AvahiSServiceResolver *, AvahiIfIndex iface, AvahiProtocol,
                                  AvahiResolverEvent event, const char *name, const char *, const char *,
                                  const char *host, const AvahiAddress *a, uint16_t port,
                                  AvahiStringList *txt, AvahiLookupResultFlags, void *ud) {
        static_cast<Browse *>(ud)->on_resolve(iface, event, name, host, a, port, txt);
    }

    std::function<bool(const std::vector<MdnsService> &)> enough_;
    std::mutex mu_;  // found_, done_, error_
    std::condition_variable cv_;
    std::map<std::string, MdnsService> found_;  // by interface and instance
    bool done_ = false;
    std::string error_;
    std::unique_ptr<Stack> stack_;
    Stack *st_ = nullptr;  // the loop thread's view of stack_ (set before stack_ may be)
    // Loop thread only:
    AvahiServiceBrowser *cbrowser_ = nullptr;
    AvahiSServiceBrowser *sbrowser_ = nullptr;
    std::map<std::string, AvahiServiceResolver *> cresolvers_;
    std::map<std::string, AvahiSServiceResolver *> sresolvers_;
};

}  // namespace

Result<std::unique_ptr<MdnsAnnouncer>> MdnsAnnouncer::start(const std::string &instance, uint16_t port,
                                                            const std::map<std::string, std::string> &txt,
                                                            int interface_index) {
    auto a = std::make_unique<AvahiAnnouncer>(instance, port, txt,
                                              interface_index < 0 ? AVAHI_IF_UNSPEC : interface_index);
    TD_TRY(a->open());
    return std::unique_ptr<MdnsAnnouncer>(std::move(a));
}

Result<std::vector<MdnsService>> mdns_browse(
    std::chrono::milliseconds timeout, const std::function<bool(const std::vector<MdnsService> &)> &enough) {
    Browse b(enough);
    TD_TRY(b.open());
    return b.wait(timeout);
}

#endif

}  // namespace td::net
