// The handshake, both sides, against a peer that sends these bytes: the acceptor (a worker facing a stranger)
// and the connector (a head facing a hostile "worker"). The input is the peer's whole stream; the first byte
// picks the side.
#include <sys/socket.h>
#include <unistd.h>

#include "cluster/handshake.h"
#include "cluster/wire.h"
#include "fuzz-util.h"
#include "net/codec.h"

using namespace td;

namespace {

const net::ClusterSecret &secret() {
    static const net::ClusterSecret s = net::ClusterSecret::from_bytes("the fuzzing cluster's secret");
    return s;
}

fuzz::Bytes frame(net::MsgType type, const fuzz::Bytes &payload) {
    net::FrameHeader h;
    h.type = static_cast<uint16_t>(type);
    h.payload_bytes = payload.size();
    fuzz::Bytes out(net::kHeaderBytes);
    net::encode_header(h, out.data());
    out.insert(out.end(), payload.begin(), payload.end());
    return out;
}

}  // namespace

TD_FUZZ_INIT(handshake) {
    std::vector<fuzz::Bytes> seeds;
    net::Hello h;
    h.role = net::ConnRole::control;
    h.build_id = "0.1.0";
    h.node_name = "head";
    h.nonce = net::make_nonce();
    fuzz::Bytes hello;
    net::encode(h, hello);
    net::AuthProof proof;
    proof.proof.fill(7);
    fuzz::Bytes p;
    net::encode(proof, p);
    fuzz::Bytes a = {0};
    for (const auto &f : {frame(net::MsgType::hello, hello), frame(net::MsgType::auth_proof, p)})
        a.insert(a.end(), f.begin(), f.end());
    seeds.push_back(a);
    net::AuthChallenge ch;
    ch.nonce.fill(3);
    fuzz::Bytes c;
    net::encode(ch, c);
    net::HelloReply hr;
    hr.node_name = "w";
    fuzz::Bytes r;
    net::encode(hr, r);
    fuzz::Bytes b = {1};
    for (const auto &f : {frame(net::MsgType::auth_challenge, c), frame(net::MsgType::hello_reply, r)})
        b.insert(b.end(), f.begin(), f.end());
    seeds.push_back(b);
    fuzz::write_seeds_and_exit_if_asked(seeds);
    return 0;
}

TD_FUZZ_TARGET(handshake) {
    if (size < 1 || size > (128u << 10)) return 0;
    int sv[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) return 0;
    const int buf = 1 << 20;
    ::setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &buf, sizeof buf);
    ::setsockopt(sv[1], SOL_SOCKET, SO_RCVBUF, &buf, sizeof buf);
    size_t off = 1;
    while (off < size) {
        const ssize_t n = ::send(sv[0], data + off, size - off, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n <= 0) break;
        off += static_cast<size_t>(n);
    }
    ::shutdown(sv[0], SHUT_WR);  // the peer has said everything it will
    auto conn = net::connection_from_fd(sv[1]);
    if (conn.ok()) {
        if (data[0] & 1) {
            net::Hello h;
            h.role = net::ConnRole::data;
            h.node_name = "fuzz";
            (void)cluster::handshake_connect(**conn, h, secret(), "fuzz", 100);
        } else {
            (void)cluster::handshake_accept(**conn, secret(), "fuzz", 100);
        }
    }
    ::close(sv[0]);
    return 0;
}
