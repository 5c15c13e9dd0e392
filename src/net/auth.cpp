#include "net/auth.h"

#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/params.h>
#include <openssl/rand.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "core/check.h"

namespace td::net {
namespace {

const char *side_label(AuthSide side) {
    return side == AuthSide::server ? "tandem-auth-v4 server proof" : "tandem-auth-v4 client proof";
}

std::string trim(const std::string &s) {
    size_t a = 0, b = s.size();
    while (a < b && std::isspace(static_cast<unsigned char>(s[a]))) ++a;
    while (b > a && std::isspace(static_cast<unsigned char>(s[b - 1]))) --b;
    return s.substr(a, b - a);
}

Status write_all(int fd, const std::string &bytes, const std::string &path) {
    size_t off = 0;
    while (off < bytes.size()) {
        const ssize_t n = ::write(fd, bytes.data() + off, bytes.size() - off);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return make_error(ErrorKind::io, "{}: cannot write: {}", path, std::strerror(errno));
        off += static_cast<size_t>(n);
    }
    return {};
}

}  // namespace

Result<ClusterSecret> ClusterSecret::load(const std::string &path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) {
        if (errno == ENOENT)
            return make_error(ErrorKind::not_found,
                              "no cluster secret at {}: copy the file `tandem worker` created there on a "
                              "worker to this path (or pass --secret-file)",
                              path);
        return make_error(ErrorKind::io, "{}: cannot open the cluster secret: {}", path, std::strerror(errno));
    }
    struct stat st {};
    std::string bytes;
    Status s;
    if (::fstat(fd, &st) != 0) {
        s = make_error(ErrorKind::io, "{}: cannot stat: {}", path, std::strerror(errno));
    } else if (!S_ISREG(st.st_mode)) {
        s = invalid_input("{}: the cluster secret must be a regular file", path);
    } else if ((st.st_mode & 077) != 0) {
        s = invalid_input("{}: the cluster secret is open to other users (mode {:04o}); run: chmod 600 {}", path,
                          st.st_mode & 07777, path);
    } else if (st.st_size > static_cast<off_t>(kMaxSecretBytes)) {
        s = invalid_input("{}: {} bytes is too long for a cluster secret (at most {})", path, st.st_size,
                          kMaxSecretBytes);
    } else {
        bytes.resize(static_cast<size_t>(st.st_size));
        size_t off = 0;
        while (off < bytes.size()) {
            const ssize_t n = ::read(fd, bytes.data() + off, bytes.size() - off);
            if (n < 0 && errno == EINTR) continue;
            if (n <= 0) break;
            off += static_cast<size_t>(n);
        }
        bytes.resize(off);
    }
    ::close(fd);
    TD_TRY(s);
    ClusterSecret secret;
    secret.key_ = trim(bytes);
    OPENSSL_cleanse(bytes.data(), bytes.size());
    if (secret.key_.size() < kMinSecretBytes)
        return invalid_input("{}: the cluster secret is {} bytes, at least {} are needed", path,
                             secret.key_.size(), kMinSecretBytes);
    return secret;
}

Result<ClusterSecret> ClusterSecret::load_or_create(const std::string &path, bool *created) {
    *created = false;
    auto loaded = load(path);
    if (loaded.ok() || loaded.status().kind() != ErrorKind::not_found) return loaded;
    const std::filesystem::path dir = std::filesystem::path(path).parent_path();
    if (!dir.empty()) {
        std::error_code ec;
        std::filesystem::create_directories(dir, ec);
        if (ec) return make_error(ErrorKind::io, "{}: cannot create: {}", dir.string(), ec.message());
    }
    uint8_t raw[32];
    if (RAND_bytes(raw, sizeof raw) != 1)
        return make_error(ErrorKind::failed, "cannot draw random bytes for a cluster secret");
    std::string hex;
    for (uint8_t b : raw) hex += fmt::format("{:02x}", b);
    OPENSSL_cleanse(raw, sizeof raw);
    hex += '\n';
    // Write a private temporary file, then link it into place: link() fails if another process got there
    // first, and then both use that one's bytes.
    uint8_t tag[8];
    if (RAND_bytes(tag, sizeof tag) != 1) return make_error(ErrorKind::failed, "cannot draw random bytes");
    std::string tmp = path + ".";
    for (uint8_t b : tag) tmp += fmt::format("{:02x}", b);
    tmp += ".tmp";
    const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) return make_error(ErrorKind::io, "{}: cannot create: {}", tmp, std::strerror(errno));
    Status ws = write_all(fd, hex, tmp);
    if (ws.ok() && ::fsync(fd) != 0) ws = make_error(ErrorKind::io, "{}: fsync: {}", tmp, std::strerror(errno));
    ::close(fd);
    OPENSSL_cleanse(hex.data(), hex.size());
    if (ws.ok() && ::link(tmp.c_str(), path.c_str()) == 0) *created = true;
    else if (ws.ok() && errno != EEXIST)
        ws = make_error(ErrorKind::io, "{}: cannot create: {}", path, std::strerror(errno));
    ::unlink(tmp.c_str());
    TD_TRY(ws);
    return load(path);
}

ClusterSecret ClusterSecret::from_bytes(std::string bytes) {
    ClusterSecret s;
    s.key_ = std::move(bytes);
    return s;
}

AuthMac ClusterSecret::prove(AuthSide side, std::span<const uint8_t> transcript, const AuthNonce &nonce) const {
    TD_ASSERT(!key_.empty(), "a proof needs a cluster secret");
    AuthMac out{};
    EVP_MAC *mac = EVP_MAC_fetch(nullptr, "HMAC", nullptr);
    TD_ASSERT(mac != nullptr, "OpenSSL has no HMAC");
    EVP_MAC_CTX *ctx = EVP_MAC_CTX_new(mac);
    char digest[] = "SHA256";
    OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string("digest", digest, 0), OSSL_PARAM_construct_end()};
    const char *label = side_label(side);
    size_t n = 0;
    const bool ok = ctx != nullptr &&
                    EVP_MAC_init(ctx, reinterpret_cast<const unsigned char *>(key_.data()), key_.size(), params) &&
                    EVP_MAC_update(ctx, reinterpret_cast<const unsigned char *>(label), std::strlen(label) + 1) &&
                    EVP_MAC_update(ctx, transcript.data(), transcript.size()) &&
                    EVP_MAC_update(ctx, nonce.data(), nonce.size()) &&
                    EVP_MAC_final(ctx, out.data(), &n, out.size());
    EVP_MAC_CTX_free(ctx);
    EVP_MAC_free(mac);
    TD_ASSERT(ok && n == out.size(), "HMAC-SHA256 failed");
    return out;
}

bool ClusterSecret::verify(AuthSide side, std::span<const uint8_t> transcript, const AuthNonce &nonce,
                           const AuthMac &proof) const {
    if (key_.empty()) return false;
    const AuthMac want = prove(side, transcript, nonce);
    return equal_constant_time(want, proof);
}

std::string default_secret_path() {
    if (const char *p = std::getenv("TANDEM_SECRET_FILE"); p != nullptr && *p != '\0') return p;
    if (const char *x = std::getenv("XDG_CONFIG_HOME"); x != nullptr && *x != '\0')
        return std::string(x) + "/tandem/cluster.secret";
    const char *home = std::getenv("HOME");
    return std::string(home != nullptr && *home != '\0' ? home : ".") + "/.config/tandem/cluster.secret";
}

AuthNonce make_nonce() {
    AuthNonce n{};
    TD_ASSERT(RAND_bytes(n.data(), static_cast<int>(n.size())) == 1, "the OS random generator failed");
    return n;
}

bool equal_constant_time(std::span<const uint8_t> a, std::span<const uint8_t> b) {
    if (a.size() != b.size()) return false;
    return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

}  // namespace td::net
