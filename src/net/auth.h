// The cluster secret, and the HMAC-SHA256 proofs of the handshake that every connection between nodes opens
// with (docs/protocol.md, "Authentication"). The secret is a file every node of a cluster holds a copy of;
// a peer proves it holds the same bytes without sending them: each side answers the other's fresh nonce
// with an HMAC over the whole Hello (role, group, rank, both nonces), so a recorded handshake never
// matches a new one and a proof for one role or direction is useless for another.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>

#include "core/status.h"

namespace td::net {

inline constexpr size_t kAuthNonceBytes = 32;
inline constexpr size_t kAuthProofBytes = 32;  // HMAC-SHA256
inline constexpr size_t kMinSecretBytes = 16;
inline constexpr size_t kMaxSecretBytes = 4096;
using AuthNonce = std::array<uint8_t, kAuthNonceBytes>;
using AuthMac = std::array<uint8_t, kAuthProofBytes>;

// Which side a proof speaks for: the same transcript gives a different proof for each, so a peer cannot
// reflect the other side's proof back at it.
enum class AuthSide { server, client };

class ClusterSecret {
public:
    ClusterSecret() = default;  // empty: no secret (every handshake refuses)
    // The key is the file's contents with surrounding white space trimmed. Errors: missing, not a regular
    // file, readable or writable by group or others (the fix: chmod 600), shorter than kMinSecretBytes.
    static Result<ClusterSecret> load(const std::string &path);
    // load(), or when the file does not exist: creates it (and its folder, mode 0700) with 32 random bytes
    // in hex, mode 0600. Safe against several processes creating it at once (one wins, all read its bytes).
    static Result<ClusterSecret> load_or_create(const std::string &path, bool *created);
    static ClusterSecret from_bytes(std::string bytes);  // tests; bytes as the key

    bool empty() const { return key_.empty(); }
    // HMAC-SHA256(key, label(side) || transcript || nonce).
    AuthMac prove(AuthSide side, std::span<const uint8_t> transcript, const AuthNonce &nonce) const;
    // Constant-time comparison of `proof` with prove(side, transcript, nonce).
    bool verify(AuthSide side, std::span<const uint8_t> transcript, const AuthNonce &nonce,
                const AuthMac &proof) const;

private:
    std::string key_;
};

// Where the secret lives when --secret-file is not given: $TANDEM_SECRET_FILE, else
// $XDG_CONFIG_HOME/tandem/cluster.secret, else ~/.config/tandem/cluster.secret.
std::string default_secret_path();
// Fresh random bytes from the OS's generator (OpenSSL RAND_bytes).
AuthNonce make_nonce();
// Constant-time equality of two byte strings (different lengths: false, in time independent of contents).
bool equal_constant_time(std::span<const uint8_t> a, std::span<const uint8_t> b);

}  // namespace td::net
