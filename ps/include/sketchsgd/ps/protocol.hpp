// Parameter-server protocol: every ZeroMQ message is a fixed 40-byte envelope frame, then payload
// frames. Codec messages (gradients, queries, answers, updates) travel as core wire-format bytes
// (compress/wire.hpp) in a payload frame; the envelope adds what ZeroMQ itself never checks.
//
//   off size field                  off size field
//    0   4  magic "SKPS"             8   8  job id (both sides must agree)
//    4   2  protocol version        16   8  round
//    6   1  message type            24   4  rank (worker; the server writes the addressee)
//    7   1  flags (zero)            28   4  number of payload frames that follow
//                                   32   8  session: the token the server issued in Welcome
//
// The session token is drawn at random for each registration. Every message of a registered
// worker must carry it, so pushes captured on one connection and replayed from another, into
// another job or into a restarted server are refused (docs/ARCHITECTURE.md, threat model).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include <sketchsgd/core/bytes.hpp>

namespace sketchsgd {
class Compressor;
}

namespace sketchsgd::ps {

struct OuterOptions;  // ps/outer.hpp

inline constexpr uint32_t kMagic = 0x53504B53;  // "SKPS"
// 5: the shard in Hello (sharded servers); 6: a federated client checks in a round ahead (the
// model of the round before, then that round's outcome); 7: replicated shards (epochs in Hello and
// Welcome, the primary-backup messages Follow, Sync, Commit, Ack, Deposed; the server's optimizer
// in Welcome, its state and step count in Model); 8: asynchronous jobs (the mode in Welcome, a
// worker's weight in Hello; an Update names its version, the push's age, its pusher and that
// worker's push number); 9: int8 payloads take a scale per 64 rows of a column (kI8Rows), not 256;
// 10: deposition by the backup's token (ReplicaInfo's token, DeposedInfo), RefuseInfo's
// elsewhere; 11: a Commit carries the whole UpdateInfo (an asynchronous push's pusher and push
// number, without which a backup that took over re-applied pushes or refused rank 0's next), a
// Sync the last outcome, the push numbers and the ranks that left (ReplicaInfo), Left; 12: Probe
// and Present (a worker counts toward a takeover only by answering the backup's probe); 13: a
// Probe may release its promise (ProbeInfo's release; the promise no longer lapses with time);
// 14: a Follow's envelope names the backup's connection (rank) and the primary's token (session)
inline constexpr uint16_t kProtocolVersion = 14;
inline constexpr size_t kEnvelopeBytes = 40;
/// No message of the protocol has more payload frames; a peer sending more is refused unread.
inline constexpr uint32_t kMaxPayloadFrames = 2;
/// Longest codec spec or refusal reason accepted (a spec carries the model's layout for codecs
/// that work per tensor: a few hundred tensors' shapes).
inline constexpr size_t kMaxText = 65536;

enum class Type : uint8_t {
  Hello = 1,       ///< worker → server: registration (HelloInfo); a federated client names
                   ///< its id as the rank and the round it was sampled for as the round
  Welcome = 2,     ///< server → worker: accepted (WelcomeInfo); the envelope's rank is the
                   ///< rank to use from then on (a federated client's slot in its round, and
                   ///< its Model follows unasked)
  Refuse = 3,      ///< server → worker: refused (RefuseInfo); the worker prints the reason
  Init = 4,        ///< rank 0 → server: initial parameters when the server has none
  Pull = 5,        ///< worker → server: send me the model
  Model = 6,       ///< server → worker: parameters as of `round` (the next round to run), then
                   ///< the outer step's momentum buffer where the job has one
  Push = 7,        ///< worker → server: Gradient message of `round`
  Query = 8,       ///< server → worker: second-round Query message
  Answer = 9,      ///< worker → server: Answer message
  Update = 10,     ///< server → worker: UpdateInfo frame, then the Update message
  Abort = 11,      ///< server → worker: `round` ended without an update (text frame: why)
  Heartbeat = 12,  ///< either way: liveness when there is no other traffic
  Bye = 13,        ///< worker → server: leaving cleanly
  Finished = 14,   ///< server → worker: the job ended at `round` (text frame: why); go home
  // Between a primary server and its backup (server/replication.hpp):
  Follow = 15,   ///< backup → primary: follow me (HelloInfo: the backup's job and epoch)
  Sync = 16,     ///< primary → backup: ReplicaInfo, then the whole state (a checkpoint's bytes)
  Commit = 17,   ///< primary → backup: CommitInfo, then round `round`'s update (or abort text)
  Ack = 18,      ///< backup → primary: holds the state as of `round` (the next round to run)
  Deposed = 19,  ///< backup → primary: took over (DeposedInfo); the primary must stop
  Left = 20,     ///< primary → backup: worker `rank` said Bye (it will not come to take over)
  // Between a backup and a worker that came to it while the primary is silent:
  Probe = 21,    ///< backup → worker: are you still looking? (ProbeInfo; `session`: a nonce),
                 ///< or: you are free of your answer (ProbeInfo's release)
  Present = 22,  ///< worker → backup: yes, unregistered (HelloInfo; `session`: the Probe's nonce)
};
inline constexpr uint8_t kMaxType = 22;

std::string_view to_string(Type t);

struct Envelope {
  Type type;
  uint64_t job = 0;
  uint64_t round = 0;
  uint32_t rank = 0;
  uint32_t frames = 0;   ///< payload frames that follow
  uint64_t session = 0;  ///< the registration's token (0 in a Hello)
};

Bytes encode(const Envelope& e);
/// Checks magic, version, type, flags and the declared frame count against what arrived
/// (frames_present payload frames) and the type's expected count. Throws WireError.
Envelope decode_envelope(std::span<const uint8_t> frame, size_t frames_present);
/// Payload frames each type carries.
uint32_t payload_frames(Type t);

/// A Hello envelope of another protocol version: its version and the rank it names (the magic,
/// version, type and rank sit where every version keeps them), so a server can say why it
/// refuses. Empty for anything else, this version's Hello included.
struct ForeignHello {
  uint16_t version;
  uint32_t rank;
};
std::optional<ForeignHello> peek_foreign_hello(std::span<const uint8_t> frame);

/// Which part of the model a server holds: shard `index` of `count`, its values starting at
/// `begin` of the model's `model_dim` (a job of one server: shard 0 of 1, from 0, of its dim).
struct ShardId {
  uint32_t index = 0;
  uint32_t count = 1;
  uint64_t begin = 0;
  uint64_t model_dim = 0;  ///< 0: the job's dim (one server)
  bool operator==(const ShardId&) const = default;
  /// "shard 1 of 4: [250, 500) of 1000", for refusals and logs (dim: the shard's length).
  std::string describe(uint64_t dim) const;
};

struct HelloInfo {
  uint32_t world = 0;  ///< workers, or a federated job's clients per round
  uint64_t dim = 0;
  std::string spec;         ///< canonical codec spec (Compressor::spec())
  uint32_t population = 0;  ///< a federated job's clients (0: a job of `world` fixed workers)
  ShardId shard;            ///< the part of the model this registration is for
  /// The highest server epoch the worker has registered with (a backup that took over has a
  /// higher one than the primary it replaced): a server of a lower epoch was deposed.
  uint64_t epoch = 0;
  /// Asynchronous jobs: what each push of this worker counts for, relative to the job's nominal
  /// push (1): the steps or tokens it represents (a worker pushing every 2H steps where the
  /// others push every H says 2). Round jobs take 1 only.
  float weight = 1.0f;
};
Bytes encode(const HelloInfo& h);
HelloInfo decode_hello(std::span<const uint8_t> frame);

struct WelcomeInfo {
  uint8_t has_model = 0;         ///< 0: rank 0 must send Init
  uint32_t heartbeat_ms = 1000;  ///< how often the worker should show liveness
  uint32_t staleness = 0;        ///< rounds a worker may push ahead of its last update
  float momentum = 0.0f;         ///< the outer step's momentum (OuterOptions), applied by all
  uint8_t nesterov = 0;
  uint64_t epoch = 0;     ///< the server's epoch (one more each time a backup takes over)
  uint8_t optimizer = 0;  ///< OuterKind: 0 SGD, 1 Adagrad, 2 Adam (and its ε, β1, β2)
  float eps = 1e-8f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  /// An asynchronous job: no rounds; the envelope's round of a Push, and of its Update or Abort,
  /// is the worker's own push number, and each push is applied as it arrives.
  uint8_t async = 0;
};
Bytes encode(const WelcomeInfo& w);
WelcomeInfo decode_welcome(std::span<const uint8_t> frame);
/// The job's optimizer as a Welcome carries it, and the other way.
OuterOptions outer_options(const WelcomeInfo& w);
WelcomeInfo& with_outer(WelcomeInfo& w, const OuterOptions& o);

struct RefuseInfo {
  bool retry = false;          ///< transient (rank still held, or not registered yet): try again
  Type refused = Type::Hello;  ///< the type of the refused message
  std::string reason;
  /// The worker registered with a later epoch than this server's: the job is served by another
  /// replica (the worker tries its next endpoint; this server is not deposed by its word).
  bool elsewhere = false;
};
Bytes encode(const RefuseInfo& r);
RefuseInfo decode_refuse(std::span<const uint8_t> frame);

struct UpdateInfo {
  float lr = 0.0f;            ///< every holder of the model does w −= lr · step
  uint32_t contributors = 0;  ///< workers whose gradients the update holds
  /// Asynchronous jobs: the server's version once this update is applied (updates applied since
  /// the job began), how many updates of other workers the server had applied since the pusher
  /// fetched the model it computed on (its age), and whose push it is (rank, push number), so
  /// a backup knows which pushes it holds. Zero in round jobs.
  uint64_t version = 0;
  uint32_t age = 0;
  uint32_t pusher = 0;
  uint64_t push = 0;
};
Bytes encode(const UpdateInfo& u);
UpdateInfo decode_update_info(std::span<const uint8_t> frame);

/// A Sync's first frame: the primary's epoch and its replication token (the state follows as a
/// checkpoint's bytes). The token is the evidence of a takeover: only a server that was sent this
/// primary's state knows it, so only its own backup can depose it (Deposed), never a peer that
/// merely reaches the port. What a backup needs beyond the checkpoint to serve as the primary
/// would comes with it: the last round's outcome as the workers got it (frames: envelope, then
/// payload; a worker that missed it gets it, codec state and all, rather than the model), and
/// in asynchronous jobs each rank's next push number (kUnknownPush where the primary has none),
/// so that a push sent again is answered, not applied twice.
inline constexpr uint64_t kUnknownPush = ~uint64_t(0);
struct ReplicaInfo {
  uint64_t epoch = 0;
  uint64_t token = 0;
  std::vector<Bytes> outcome;
  std::vector<uint64_t> pushes;
  std::vector<uint32_t> left;  ///< ranks that said Bye (as Left tells them one by one)
};
Bytes encode(const ReplicaInfo& r);
ReplicaInfo decode_replica_info(std::span<const uint8_t> frame);

/// A Commit's first frame: how round `round` ended on the primary, so the backup ends it alike.
struct CommitInfo {
  uint64_t epoch = 0;
  Type outcome = Type::Update;  ///< Update (the next frame: its message) or Abort (its reason)
  UpdateInfo info;              ///< the Update's learning rate and contributors
  Bytes codec_state;            ///< the aggregator's state after the round (FetchSGD's sketches)
};
/// A Deposed notice: the token of the primary's Sync, and why (the backup's takeover).
struct DeposedInfo {
  uint64_t token = 0;
  std::string reason;
};
Bytes encode(const DeposedInfo& d);
DeposedInfo decode_deposed(std::span<const uint8_t> frame);

/// A Probe: the epoch the backup would take over as. A worker that answers keeps away from
/// servers of an older epoch until it registers with one of `epoch` or later, or until that
/// backup, following its primary again, releases it (`release` = 1: the backup did not take over
/// and counts no answer to its probes any more).
struct ProbeInfo {
  uint64_t epoch = 0;
  uint8_t release = 0;
};
Bytes encode(const ProbeInfo& p);
ProbeInfo decode_probe(std::span<const uint8_t> frame);

Bytes encode(const CommitInfo& c);
CommitInfo decode_commit_info(std::span<const uint8_t> frame);

/// The largest frame a message of a job with this codec carries (both ends set ZMQ_MAXMSGSIZE
/// from it): a codec message, a refusal's text, or the model with its outer momentum.
uint64_t max_frame_bytes(const Compressor& codec);

Bytes encode_text(std::string_view s);
std::string decode_text(std::span<const uint8_t> frame);

}  // namespace sketchsgd::ps
