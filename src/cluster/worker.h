// `tandem worker`: serves pipeline stages to a head.
//
// One listening port takes every kind of connection. Each opens with the handshake (cluster/handshake.h): a
// peer that cannot prove it holds the cluster secret is refused and logged before anything else is read. Then
// the Hello's role says which kind it is:
//   control (from the head): HelloReply, then LoadStage -> LoadReply [-> WeightsChunk...] -> StageReady,
//                            then Ping/Pong, StatsRequest/StatsReply, Shutdown. When it closes, the stage is
//                            dropped and the worker keeps listening. A new control connection replaces the
//                            old one (the head reconnecting after a failure).
//   data (from the previous hop): HelloReply, then handed to the loaded stage as its input.
//   peer (from another rank of this worker's tensor-parallel group): handed to the stage's collective.
// Weights come from --model when its stage fingerprint matches the head's, else from the cache dir
// (<fingerprint>.gguf), else the head streams the stage file, which is verified and then cached.
#pragma once

#include <atomic>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "cluster/stage-cache.h"
#include "core/status.h"
#include "core/thread-pool.h"
#include "gguf/gguf.h"
#include "net/auth.h"
#include "net/protocol.h"
#include "net/transport.h"

namespace td {
class Model;
}

namespace td::cluster {

class Stage;

struct WorkerOptions {
    std::string host = "127.0.0.1";
    uint16_t port = 0;       // 0: a free port (see address())
    int32_t n_threads = 0;   // 0: all cores
    std::string model_path;  // optional local copy of the model
    std::string cache_dir;   // where streamed stage files are kept (created when missing)
    StageCacheOptions cache; // its size cap and the disk space it leaves free (stage-cache.h)
    std::string pack_dir;    // where packed weights are cached (ModelLoadOptions::pack_dir); "": none
    net::ClusterSecret secret;  // every connection must prove it holds the same (create() refuses none)
    uint32_t transports = net::auto_transports();  // what this worker's links may use (--transport)
};

class Worker {
public:
    // Binds the port, measures the speed reported in HelloReply. Errors: bad address, port in use, a
    // --model that does not open, a cache dir that cannot be created.
    static Result<std::unique_ptr<Worker>> create(const WorkerOptions &options);
    ~Worker();

    std::string address() const { return listener_->address(); }
    // What this worker answers Hello with (threads, memory now, measured speed, build), for its announcement.
    net::HelloReply describe() const { return hello_reply(); }
    // Accepts connections until stop(); each connection is served on its own thread.
    void serve();
    // Makes serve() return (closes the listener and every connection). Thread-safe.
    void stop();

private:
    Worker() = default;
    // accept_seq: the order connections were accepted in; a control connection accepted earlier than the
    // active one is stale (its head already went away and came back) and is closed instead of replacing it.
    void handle_connection(std::unique_ptr<net::Connection> conn, uint64_t accept_seq);
    void serve_control(std::unique_ptr<net::Connection> conn, uint64_t accept_seq);
    Status load_stage(net::Connection &conn, const net::LoadStage &ls);
    Result<std::shared_ptr<Model>> obtain_weights(net::Connection &conn, const net::LoadStage &ls,
                                                  std::string *source);
    // A tensor-parallel rank's slice file: from the cache, cut from --model, or streamed from the head.
    Result<std::shared_ptr<Model>> obtain_slice(net::Connection &conn, const net::LoadStage &ls,
                                                std::string *source);
    Status receive_stage_file(net::Connection &conn, const net::LoadStage &ls, const std::string &path);
    net::HelloReply hello_reply() const;
    void drop_stage();

    WorkerOptions opt_;
    std::unique_ptr<net::Listener> listener_;
    std::unique_ptr<ThreadPool> pool_;
    float gflops_ = 0.0f;
    std::string cpu_;
    std::unique_ptr<gguf::File> local_model_;  // --model, opened once
    std::unique_ptr<StageCache> cache_;        // cache_dir, when given

    std::atomic<bool> stopping_{false};
    std::mutex threads_mu_;
    struct Handler {
        std::thread thread;
        std::shared_ptr<std::atomic<bool>> done;
    };
    std::list<Handler> handlers_;

    std::mutex control_mu_;               // one control connection at a time
    net::Connection *control_ = nullptr;  // the active one (owned by its handler thread)
    uint64_t control_seq_ = 0;            // its accept_seq
    std::mutex stage_mu_;
    std::unique_ptr<Stage> stage_;
    std::mutex probes_mu_;                  // open probe connections (netbench, plan), closed by stop()
    std::vector<net::Connection *> probes_;  // owned by their handler threads
    uint64_t accept_seq_ = 0;  // serve() thread only
    std::atomic<int> pending_handshakes_{0};
};

// A Worker in this process, served on its own thread until destroyed: the head's own node (`--head-node`),
// which the head loads, probes and links like any worker.
class LocalWorker {
public:
    static Result<std::unique_ptr<LocalWorker>> start(const WorkerOptions &options);
    ~LocalWorker();
    std::string address() const { return worker_->address(); }

private:
    LocalWorker() = default;
    std::unique_ptr<Worker> worker_;
    std::thread thread_;
};

}  // namespace td::cluster
