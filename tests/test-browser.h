// Headless Chromium for the dashboard tests, driven over the DevTools protocol on a pipe
// (--remote-debugging-pipe: the browser reads NUL-terminated JSON commands on fd 3 and writes replies and
// events on fd 4), so no WebSocket client is needed. Debian's `chromium` package; absent, available() is
// false.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "test-util.h"

extern char **environ;

namespace td::test {

class Browser {
public:
    using json = nlohmann::json;

    // Starts `chromium --headless` with a fresh profile and a 1280x900 window, and attaches to its page.
    Browser() {
        const std::string bin = find_chromium();
        if (bin.empty()) return;
        std::signal(SIGPIPE, SIG_IGN);  // a browser that died fails a write instead of killing the test
        int to_browser[2], from_browser[2];
        if (pipe2(to_browser, O_CLOEXEC) != 0 || pipe2(from_browser, O_CLOEXEC) != 0) return;
        const std::vector<std::string> args = {bin,
                                               "--headless=new",
                                               "--no-sandbox",
                                               "--disable-gpu",
                                               "--disable-dev-shm-usage",
                                               "--no-first-run",
                                               "--no-default-browser-check",
                                               "--disable-extensions",
                                               "--disable-background-networking",
                                               "--disable-component-update",
                                               "--disable-sync",
                                               "--mute-audio",
                                               "--hide-scrollbars",
                                               "--force-device-scale-factor=1",
                                               "--window-size=1280,900",
                                               "--remote-debugging-pipe",
                                               "--user-data-dir=" + profile_.path(),
                                               "about:blank"};
        std::vector<char *> argv;
        for (const std::string &a : args) argv.push_back(const_cast<char *>(a.c_str()));
        argv.push_back(nullptr);
        log_path_ = profile_.file("chromium.log");
        posix_spawn_file_actions_t fa;
        posix_spawn_file_actions_init(&fa);
        posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
        posix_spawn_file_actions_addopen(&fa, 1, log_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
        posix_spawn_file_actions_adddup2(&fa, 1, 2);
        posix_spawn_file_actions_adddup2(&fa, to_browser[0], 3);
        posix_spawn_file_actions_adddup2(&fa, from_browser[1], 4);
        posix_spawnattr_t attr;
        posix_spawnattr_init(&attr);
        posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);  // its own group: its children die with it
        posix_spawnattr_setpgroup(&attr, 0);
        const int rc = posix_spawn(&pid_, bin.c_str(), &fa, &attr, argv.data(), environ);
        posix_spawn_file_actions_destroy(&fa);
        posix_spawnattr_destroy(&attr);
        close(to_browser[0]);
        close(from_browser[1]);
        out_ = to_browser[1];
        in_ = from_browser[0];
        if (rc != 0) {
            pid_ = -1;
            return;
        }
        // The page chromium opened: attach to it (flat sessions: commands carry its sessionId).
        json targets = call_browser("Target.getTargets");
        for (const json &t : targets.value("targetInfos", json::array()))
            if (t.value("type", "") == "page") {
                json a =
                    call_browser("Target.attachToTarget", {{"targetId", t["targetId"]}, {"flatten", true}});
                session_ = a.value("sessionId", "");
                break;
            }
        if (session_.empty()) return;
        call("Emulation.setDeviceMetricsOverride",
             {{"width", 1280}, {"height", 900}, {"deviceScaleFactor", 1}, {"mobile", false}});
        ready_ = true;
    }

    ~Browser() {
        if (out_ >= 0) close(out_);  // chromium exits when its pipe closes; the kill is the backstop
        if (pid_ > 0) {
            for (int i = 0; i < 50; ++i) {
                int status = 0;
                if (waitpid(pid_, &status, WNOHANG) == pid_) {
                    pid_ = -1;
                    break;
                }
                std::this_thread::sleep_for(std::chrono::milliseconds(20));
            }
            if (pid_ > 0) {
                ::kill(-pid_, SIGKILL);
                waitpid(pid_, nullptr, 0);
            }
        }
        if (in_ >= 0) close(in_);
    }
    Browser(const Browser &) = delete;
    Browser &operator=(const Browser &) = delete;

    static std::string find_chromium() {
        if (const char *env = std::getenv("TD_CHROMIUM"); env != nullptr && *env != 0) return env;
        for (const char *p : {"/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome"})
            if (access(p, X_OK) == 0) return p;
        return "";
    }
    static bool installed() { return !find_chromium().empty(); }

    bool ready() const { return ready_; }
    std::string log() const { return read_file(log_path_); }

    // Sends one command to the page (call) or the browser (call_browser) and returns its result; a protocol
    // error or a timeout (30 s) fails the test and returns null.
    json call(const std::string &method, const json &params = json::object()) {
        return send(method, params, session_);
    }
    json call_browser(const std::string &method, const json &params = json::object()) {
        return send(method, params, "");
    }

    // Loads `url` and waits for the document to finish loading.
    void navigate(const std::string &url) {
        call("Page.navigate", {{"url", url}});
        wait_for("document.readyState === 'complete'", std::chrono::seconds(20));
    }

    // The value of a JavaScript expression in the page (awaited when it is a promise); an exception fails the
    // test and returns null.
    json eval(const std::string &expression) {
        json r = call("Runtime.evaluate",
                      {{"expression", expression}, {"returnByValue", true}, {"awaitPromise", true}});
        if (r.is_null()) return nullptr;
        if (r.contains("exceptionDetails")) {
            ADD_FAILURE() << expression << " threw " << r["exceptionDetails"].dump();
            return nullptr;
        }
        return r["result"].value("value", json());
    }

    // Polls `expression` until it is true; false after `timeout`.
    bool wait_for(const std::string &expression, std::chrono::milliseconds timeout) {
        const auto deadline = std::chrono::steady_clock::now() + timeout;
        while (std::chrono::steady_clock::now() < deadline) {
            json v = eval(expression);
            if (v.is_boolean() && v.get<bool>()) return true;
            std::this_thread::sleep_for(std::chrono::milliseconds(100));
        }
        return false;
    }

    // Writes a PNG of the viewport to `path`.
    bool screenshot(const std::string &path) {
        json r = call("Page.captureScreenshot", {{"format", "png"}});
        if (!r.is_object() || !r.contains("data")) return false;
        const std::string png = base64_decode(r["data"].get<std::string>());
        std::filesystem::create_directories(std::filesystem::path(path).parent_path());
        std::ofstream(path, std::ios::binary).write(png.data(), static_cast<std::streamsize>(png.size()));
        return png.size() > 8 && png.compare(1, 3, "PNG") == 0;
    }

    static std::string base64_decode(const std::string &in) {
        std::string out;
        uint32_t acc = 0;
        int bits = 0;
        for (char c : in) {
            int v;
            if (c >= 'A' && c <= 'Z')
                v = c - 'A';
            else if (c >= 'a' && c <= 'z')
                v = c - 'a' + 26;
            else if (c >= '0' && c <= '9')
                v = c - '0' + 52;
            else if (c == '+')
                v = 62;
            else if (c == '/')
                v = 63;
            else
                continue;  // '=' padding, line breaks
            acc = (acc << 6) | static_cast<uint32_t>(v);
            bits += 6;
            if (bits >= 8) {
                bits -= 8;
                out.push_back(static_cast<char>((acc >> bits) & 0xff));
            }
        }
        return out;
    }

private:
    json send(const std::string &method, const json &params, const std::string &session,
              std::chrono::seconds timeout = std::chrono::seconds(30)) {
        const int id = ++next_id_;
        json msg = {{"id", id}, {"method", method}, {"params", params}};
        if (!session.empty()) msg["sessionId"] = session;
        std::string bytes = msg.dump();
        bytes.push_back('\0');
        for (size_t off = 0; off < bytes.size();) {
            const ssize_t n = write(out_, bytes.data() + off, bytes.size() - off);
            if (n <= 0) {
                ADD_FAILURE() << "chromium's pipe closed while sending " << method << "\n" << log();
                return nullptr;
            }
            off += static_cast<size_t>(n);
        }
        const auto deadline = std::chrono::steady_clock::now() + timeout;
        for (;;) {
            for (size_t end; (end = buf_.find('\0')) != std::string::npos;) {
                json reply = json::parse(buf_.substr(0, end), nullptr, false);
                buf_.erase(0, end + 1);
                if (!reply.is_object() || reply.value("id", 0) != id) continue;  // an event, or an old reply
                if (reply.contains("error")) {
                    ADD_FAILURE() << method << ": " << reply["error"].dump();
                    return nullptr;
                }
                return reply.value("result", json::object());
            }
            const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                deadline - std::chrono::steady_clock::now());
            if (left.count() <= 0) {
                ADD_FAILURE() << method << ": no reply from chromium\n" << log();
                return nullptr;
            }
            pollfd p{in_, POLLIN, 0};
            if (poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
            char chunk[65536];
            const ssize_t n = read(in_, chunk, sizeof(chunk));
            if (n <= 0) {
                ADD_FAILURE() << method << ": chromium went away\n" << log();
                return nullptr;
            }
            buf_.append(chunk, static_cast<size_t>(n));
        }
    }

    TempDir profile_;
    std::string log_path_;
    pid_t pid_ = -1;
    int out_ = -1, in_ = -1;
    std::string buf_;
    std::string session_;
    int next_id_ = 0;
    bool ready_ = false;
};

}  // namespace td::test
