// SPDX-License-Identifier: MIT
// Volume: construction (servers, channels, reattach), channels, donor health, status.
// The rest: volume_io.cpp (reads, writes, trim, zero), volume_alloc.cpp (placement,
// allocation, give-back of slabs), volume_fence.cpp (epochs and floors), volume_maint.cpp
// (repair, give-back moves, the clone routine).
#include "common/volume/volume.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>

#include "common/obs/log.h"
#include "common/util/err_text.h"
#include "common/volume/reattach.h"
#include "common/volume/volume_internal.h"

namespace rdmaswap {

namespace {
// Each thread starts looking for a free channel at its own one.
std::atomic<unsigned> g_next_thread{0};
// Its index + 1 (0: not yet given). Constant-initialized and initial-exec, so that it lives in
// the thread's static TLS block (a few bytes of the surplus glibc keeps for dlopen'ed modules)
// rather than in a dynamic TLS block that glibc mallocs for the dlopen'ed plugin: under
// ThreadSanitizer, a read of it by a finished nbdkit thread and the free of a later thread's
// dynamic TLS block at the same address were reported as a race.
thread_local unsigned t_thread_index1 __attribute__((tls_model("initial-exec"))) = 0;
unsigned thread_index()
{
	if (t_thread_index1 == 0)
		t_thread_index1 = g_next_thread.fetch_add(1) + 1;
	return t_thread_index1 - 1;
}
} // namespace

Volume::Volume(std::vector<std::unique_ptr<Server>> servers, const VolumeOptions &opts)
	: size_(opts.size), buffer_size_(opts.buffer_size), timeout_(opts.timeout),
	  repair_interval_(opts.repair_interval), down_cooldown_(opts.down_cooldown),
	  rng_(std::random_device{}())
{
	if (servers.empty())
		throw std::runtime_error("a volume needs at least one memserver");
	if (opts.max_servers == 0 || opts.max_servers > kMaxServers)
		throw std::runtime_error("at most " + std::to_string(kMaxServers) + " memservers");
	if (servers.size() > opts.max_servers)
		throw std::runtime_error("at most " + std::to_string(opts.max_servers) +
					 " memservers");
	max_servers_ = opts.max_servers;
	start_holders_ = opts.start_holders;
	servers_ = std::make_unique<std::unique_ptr<Server>[]>(max_servers_);
	const size_t nstart = servers.size();
	for (size_t i = 0; i < nstart; i++)
		servers_[i] = std::move(servers[i]);
	// Published at once: nothing else runs yet (the threads start at the end).
	nservers_.store(nstart, std::memory_order_release);
	const std::span<const std::unique_ptr<Server>> start(servers_.get(), nstart);
	if (size_ == 0)
		throw std::runtime_error("volume size must be greater than 0");
	if (opts.channels == 0 || opts.channels > 1024)
		throw std::runtime_error("channels must be between 1 and 1024");
	if (opts.paths == 0 || opts.paths > 1024)
		throw std::runtime_error("paths must be between 1 and 1024");
	if (opts.replicas == 0 || opts.replicas > kMaxReplicas)
		throw std::runtime_error("replicas must be between 1 and " +
					 std::to_string(kMaxReplicas));
	if (opts.replicas > nstart)
		throw std::runtime_error("replicas=" + std::to_string(opts.replicas) + " needs at least " +
					 std::to_string(opts.replicas) + " reachable memservers, have " +
					 std::to_string(nstart));
	replicas_ = opts.replicas;
	slab_size_ = servers_[0]->info().slab_size;
	if (slab_size_ < 4096 || (slab_size_ & (slab_size_ - 1)) != 0)
		throw std::runtime_error("memserver " + servers_[0]->name() +
					 " reports a slab size that is not a power of two >= 4096");
	for (auto &s : start)
		check_fits(*s);
	if (buffer_size_ == 0 || buffer_size_ % 4096 != 0 || buffer_size_ > proto::kMaxIo)
		throw std::runtime_error("channel buffer size must be a multiple of 4096 up to 1 MiB");
	nslabs_ = (size_ + slab_size_ - 1) / slab_size_;
	// The per-slab table (slabs_ below; sizeof(Slab), 464 bytes on x86-64, a slab, locked in
	// memory with the rest of nbdkit) is sized by the slab count, so the count is bounded:
	// 2^20 slabs, a table of at most 464 MiB. That is a volume of up to 256 TiB with the
	// memserver's default 256 MiB slabs (1.8 MiB of table a TiB), 1 TiB with 1 MiB slabs
	// (464 MiB a TiB), 64 GiB with 64 KiB slabs. Beyond it the table alone could exhaust the
	// host's memory (size=1P in 1 MiB slabs: 464 GiB): refused with the maximum instead.
	constexpr uint64_t kMaxSlabs = uint64_t(1) << 20;
	if (nslabs_ > kMaxSlabs) {
		// Powers of two (slab sizes, kMaxSlabs times one: below size_, so no overflow) in
		// their largest whole unit.
		auto human = [](uint64_t v) {
			static const char *const units[] = {"bytes", "KiB", "MiB", "GiB", "TiB",
							    "PiB", "EiB"};
			unsigned u = 0;
			while (u + 1 < std::size(units) && v >= 1024 && v % 1024 == 0)
				v /= 1024, u++;
			return std::to_string(v) + " " + units[u];
		};
		throw std::runtime_error(
			"size=" + std::to_string(size_) + " is too large: a volume has at most " +
			std::to_string(kMaxSlabs) + " slabs, and memserver " + servers_[0]->name() +
			"'s slabs are " + human(slab_size_) + ", so the maximum size is " +
			human(kMaxSlabs * slab_size_) + " (" + std::to_string(kMaxSlabs * slab_size_) +
			" bytes; each slab costs " + std::to_string(sizeof(Slab)) +
			" bytes of nbdkit's memory); use a smaller size=, or memservers with larger "
			"slabs (--slab-size)");
	}
	uint64_t capacity = 0;
	for (auto &s : start)
		capacity += uint64_t(s->info().slabs_total) * slab_size_;
	if (capacity < size_ * replicas_)
		logger("volume")->warn("volume of {} bytes x {} replicas is larger than the "
				       "memservers' total capacity of {} bytes: writes will fail "
				       "with ENOSPC when it is full",
				       size_, replicas_, capacity);
	slabs_ = std::make_unique<Slab[]>(nslabs_);
	sstate_ = std::make_unique<ServerState[]>(max_servers_);
	place_loads_ = std::make_unique<DonorLoad[]>(max_servers_);

	// The maintenance thread's channel holds two copy windows (one being read from the source
	// while the other is written to the destination).
	clone_job_.block = std::min<uint64_t>({slab_size_, kCloneBlock, buffer_size_});
	clone_job_.nblocks = slab_size_ / clone_job_.block;
	clone_job_.dirty = std::make_unique<std::atomic<uint64_t>[]>((clone_job_.nblocks + 63) / 64);
	clone_job_.window = unsigned(std::min<uint64_t>(
		{kMaxBatch, std::max<uint64_t>(1, kCopyWindow / clone_job_.block), clone_job_.nblocks}));
	const size_t window = size_t(clone_job_.block) * clone_job_.window;
	const unsigned nch = opts.channels;
	// (If the constructor throws from here on, the members declared after region_ (the
	// channels and their data paths, which point into it) are destroyed before it.)
	if (const int err = region_.map(buffer_size_ * nch + 2 * window))
		throw std::runtime_error(std::string("cannot map channel buffers: ") + err_text(err));
	if (const int err = region_.lock())
		logger("volume")->warn("cannot lock {} bytes of channel buffers: {}", region_.size(),
				       err_text(err));
	npaths_ = std::min(opts.paths, nch);
	for (unsigned i = 0; i <= nch; i++) {
		auto ch = std::make_unique<Channel>();
		ch->buf = region_.data() + size_t(i) * buffer_size_;
		ch->index = i;
		if (i < nch)
			channels_.push_back(std::move(ch));
		else
			maint_ch_ = std::move(ch);
	}
	maint_ch_->paths = std::make_unique<std::unique_ptr<DataPath>[]>(max_servers_);
	io_paths_ = std::make_unique<std::unique_ptr<DonorPaths>[]>(max_servers_);
	for (size_t k = 0; k < nstart; k++)
		open_paths(k, *start[k]);
	tagged_ = true;
	for (auto &srv : start)
		tagged_ = tagged_ && srv->bound();
	if (tagged_)
		recover(opts.missing_servers);
	open_backup(opts);
	wanted_.resize(max_servers_);
	repair_thread_ = std::thread([this] { guarded("repair", [this] { repair_loop(); }); });
	poll_thread_ = std::thread([this] { guarded("give-back poll", [this] { poll_loop(); }); });
}

void Volume::recover(unsigned missing)
{
	auto log = logger("volume");
	std::vector<FoundSlab> found;
	std::vector<FoundFloor> floors;
	unsigned reattached = 0;
	const unsigned unreachable = missing;
	const size_t nserv = servers();
	for (size_t i = 0; i < nserv; i++) {
		if (!servers_[i]->reattached()) {
			if (i < start_holders_)
				missing++; // it may have held slabs of ours, and handed nothing back
			continue;
		}
		reattached++;
		std::vector<proto::VolumeEntry> sl, fl;
		if (int err = servers_[i]->list_volume(sl, fl))
			throw std::runtime_error("memserver " + servers_[i]->name() +
						 ": cannot list the slabs kept for the volume: " +
						 err_text(err));
		for (const auto &e : sl)
			found.push_back(FoundSlab{uint16_t(i), e.slab_id, e.rkey, e.addr, e.chunk, e.epoch});
		for (const auto &e : fl)
			floors.push_back(FoundFloor{e.chunk, e.epoch});
	}
	if (reattached == 0) {
		log->warn("no memserver kept anything for this volume: it starts EMPTY (a first "
			  "start; or the lease expired or the memservers restarted, and whatever it "
			  "held before is gone)");
		return;
	}
	ReattachInput in;
	in.nchunks = nslabs_;
	in.replicas = replicas_;
	in.max_replicas = kMaxReplicas;
	in.missing = missing;
	in.slabs = found;
	in.floors = floors;
	const ReattachPlan plan = plan_reattach(in);
	uint64_t degraded = 0;
	for (const auto &c : plan.chunks) {
		Slab &s = slabs_[c.chunk];
		for (size_t idx : c.use) {
			const FoundSlab &f = found[idx];
			s.rep[s.nrep++] = Replica{f.server, sstate_[f.server].gen.load(),
						  SlabGrant{f.slab_id, slab_size_, f.addr, f.rkey}, f.epoch};
			sstate_[f.server].used.fetch_add(1);
		}
		s.epoch = c.epoch;
		degraded += s.nrep < replicas_;
	}
	for (uint64_t c : plan.lost)
		slabs_[c].lost = true;
	uint64_t lost = plan.lost.size();
	if (plan.all_empty_lost)
		for (uint64_t i = 0; i < nslabs_; i++)
			if (slabs_[i].nrep == 0 && !slabs_[i].lost) {
				slabs_[i].lost = true;
				lost++;
			}
	for (size_t idx : plan.discard)
		servers_[found[idx].server]->free_slab(found[idx].slab_id);
	reattached_.store(plan.chunks.size());
	reattach_stale_.store(plan.stale);
	log->info("reattached: {} chunks with data ({} degraded, repaired in the background) from "
		  "{} of {} memservers; {} stale and {} incomplete replicas given back",
		  plan.chunks.size(), degraded, reattached, nserv + unreachable,
		  plan.stale, plan.incomplete);
	if (plan.out_of_range)
		log->warn("reattach: {} slabs lie beyond the volume's size (was it smaller before?): "
			  "given back",
			  plan.out_of_range);
	if (lost)
		log->error("reattach: {} chunks are LOST and read as errors (EIO), never as zeros or "
			   "stale bytes: {}{}",
			   lost,
			   plan.all_empty_lost ? "memservers that may have held them did not hand back "
						 "the volume (unreachable, restarted or lease expired); "
					       : "",
			   plan.lost.empty() ? "" : "their newest replicas are gone");
	if (degraded)
		kick_repair();
}

void Volume::check_fits(const Server &s) const
{
	if (s.info().slab_size != slab_size_)
		throw std::runtime_error("memservers " + servers_[0]->name() + " and " + s.name() +
					 " use different slab sizes");
	if (s.info().max_io < buffer_size_)
		throw std::runtime_error("memserver " + s.name() +
					 " accepts smaller I/O than the channel buffer");
}

size_t Volume::add_server(std::unique_ptr<Server> server)
{
	std::lock_guard add(add_mu_);
	const size_t i = nservers_.load(std::memory_order_relaxed);
	if (i >= max_servers_)
		throw std::runtime_error("memserver " + server->name() + " not added: the volume has " +
					 std::to_string(max_servers_) + " donors already");
	check_fits(*server);
	if (server->bound() != tagged_)
		throw std::runtime_error("memserver " + server->name() +
					 (tagged_ ? " is not bound to the volume" : " is bound to a volume"));
	if (server->reattached()) {
		// What it kept is taken over only at start (the reattach plan needs every donor's
		// slabs and floors at once). A session kept with nothing in it (a donor contacted
		// at start and left unused: common/cluster/membership.h) is fine to use.
		std::vector<proto::VolumeEntry> sl, fl;
		const int err = server->list_volume(sl, fl);
		if (err || !sl.empty() || !fl.empty())
			throw std::runtime_error(
				"memserver " + server->name() +
				(err ? ": cannot list what it kept for this volume: " +
					       std::string(err_text(err))
				     : " kept slabs of this volume from an earlier run: they are taken "
				       "over only when nbdkit starts (restart it to use them); not used "
				       "meanwhile"));
	}
	// The paths first (network waits, no lock of the data path held), then the server
	// becomes visible. A channel's slot for `i` is read only by whoever learnt `i` after the
	// release store below.
	open_paths(i, *server);
	sstate_[i].gen.store(0);
	sstate_[i].down_until.store(0);
	sstate_[i].used.store(0);
	sstate_[i].placing.store(0);
	sstate_[i].retired.store(false);
	sstate_[i].outside.store(false);
	sstate_[i].closed.store(false);
	servers_[i] = std::move(server);
	nservers_.store(i + 1, std::memory_order_release);
	logger("volume")->info("memserver {} added: {} donors now", servers_[i]->name(), i + 1);
	kick_repair(); // degraded slabs may have a place now
	return i;
}

void Volume::open_paths(size_t i, Server &s)
{
	const std::span<std::byte> region = region_.bytes();
	auto io = std::make_unique<DonorPaths>();
	// Where paths share a connection (TCP), each channel may have a path of its own, its
	// requests in flight beside those of the other paths on the connection: a request
	// queues for a path only when every channel is busy on this donor.
	const unsigned want = unsigned(
		std::min<size_t>(channels_.size(), size_t(npaths_) * std::max(1u, s.path_sharing())));
	io->path = std::make_unique<SharedPath[]>(want);
	for (unsigned k = 0; k < npaths_; k++)
		io->path[k].dp = s.open_data_path(region);
	io->n = npaths_;
	for (unsigned k = npaths_; k < want; k++) {
		auto dp = s.share_data_path(*io->path[k % npaths_].dp);
		if (!dp)
			break;
		io->path[k].dp = std::move(dp);
		io->n = k + 1;
	}
	auto maint = s.open_data_path(region);
	io_paths_[i] = std::move(io);
	maint_ch_->paths[i] = std::move(maint);
}

void Volume::set_retired(size_t i, bool retired)
{
	if (i >= servers() || sstate_[i].retired.exchange(retired) == retired)
		return;
	logger("volume")->info("memserver {} {}", servers_[i]->name(),
			       retired ? "retired: it gets no new slabs; its replicas serve on"
				       : "no longer retired: it may get new slabs");
}

void Volume::set_outside(size_t i, bool outside)
{
	if (i >= servers() || sstate_[i].outside.exchange(outside) == outside)
		return;
	logger("volume")->debug("memserver {} {} the donor set", servers_[i]->name(),
				outside ? "left" : "joined");
}

bool Volume::close_idle_server(size_t i)
{
	if (i >= servers() || sstate_[i].closed.load())
		return false;
	{
		// place() reads `closed` and counts `placing` under place_mu_: once this section
		// saw nothing placed and set `closed`, no placement chooses the donor. A slab whose
		// ALLOC was answered in between is in the server's grants: close_if_idle() refuses.
		std::lock_guard lock(place_mu_);
		if (sstate_[i].used.load() || sstate_[i].placing.load())
			return false;
		sstate_[i].closed.store(true);
	}
	if (!servers_[i]->close_if_idle()) {
		sstate_[i].closed.store(false);
		return false;
	}
	// Nothing of the volume is there and nothing can be placed there: no thread posts to
	// these paths; each is closed with its lock held all the same (one deadline for all).
	unsigned open = 0;
	const auto deadline = Clock::now() + timeout_;
	for (unsigned k = 0; k < io_paths_[i]->n; k++) {
		SharedPath &p = io_paths_[i]->path[k];
		if (!p.mu.try_lock_until(deadline)) {
			open++;
			continue;
		}
		p.dp->close_for_good();
		io_paths_[i]->give(p);
	}
	kick_repair(); // the maintenance thread closes its own path to it
	if (open)
		logger("volume")->warn("memserver {}: {} of its data connections not closed (their "
				       "channels stayed busy for the timeout); unused",
				       servers_[i]->name(), open);
	logger("volume")->info("memserver {} disconnected: idle (this volume holds nothing there)",
			       servers_[i]->name());
	return true;
}

void Volume::donor_restarted(size_t i)
{
	if (i >= servers())
		return;
	sstate_[i].retired.store(true);
	logger("volume")->warn("memserver {} restarted (a new boot id): the slabs it held are gone",
			       servers_[i]->name());
	invalidate(uint16_t(i));
}

Volume::~Volume()
{
	{
		std::lock_guard lock(repair_mu_);
		stop_.store(true);
	}
	repair_cv_.notify_all();
	if (repair_thread_.joinable())
		repair_thread_.join();
	if (poll_thread_.joinable())
		poll_thread_.join();
	if (backup_) {
		// The slabs holding data, for the next run (no I/O runs any more).
		for (uint64_t i = 0; i < nslabs_; i++)
			backup_->set_live(i, slabs_[i].nrep != 0 || slabs_[i].lost);
		backup_.reset(); // writes out its queue, then marks the file clean if it can
	}
	io_paths_.reset(); // data paths reference the region: drop them first
	channels_.clear();
	maint_ch_.reset();
	region_.reset();
}

void Volume::open_backup(const VolumeOptions &o)
{
	if (o.backup_path.empty())
		return;
	auto log = logger("volume");
	BackupOptions b;
	b.path = o.backup_path;
	b.volume = o.backup_volume;
	b.size = size_;
	b.slab_size = slab_size_;
	b.chunk = buffer_size_;
	b.queues = unsigned(channels_.size());
	b.queue_bytes = o.backup_queue;
	b.run_id = o.run_id;
	b.previous_run_id = o.previous_run_id;
	backup_ = std::make_unique<Backup>(b);
	bool prior = false; // the volume holds data from an earlier run
	for (uint64_t i = 0; i < nslabs_ && !prior; i++)
		prior = slabs_[i].nrep != 0 || slabs_[i].lost;
	if (backup_->clean()) {
		// Closed cleanly by the previous run: it holds what every slab held then. Slabs
		// with data then that no donor gave back are served by it (and repaired from it);
		// slabs it knows were empty read zeros (even when too many donors are missing to
		// tell otherwise).
		uint64_t restored = 0;
		for (uint64_t i = 0; i < nslabs_; i++) {
			Slab &s = slabs_[i];
			if (s.nrep == 0) {
				s.lost = backup_->live_at_close(i);
				restored += s.lost;
			} else if (!backup_->live_at_close(i)) {
				backup_->distrust(i); // a replica of a slab the file has as empty
			}
		}
		backup_->start(false, [](uint64_t) { return true; }, [](uint64_t) { return false; });
		if (restored) {
			log->warn("backup {}: {} slabs no memserver kept are served from it (closed "
				  "cleanly by the previous run) until they are copied to memservers",
				  o.backup_path, restored);
			kick_repair();
		} else {
			log->info("backup {}: in use, closed cleanly by the previous run", o.backup_path);
		}
	} else if (!prior) {
		backup_->start(true, [](uint64_t) { return true; }, [](uint64_t) { return false; });
		log->info("backup {}: in use, every write also goes there", o.backup_path);
	} else {
		// Not closed cleanly (or by an older run): what it holds of the slabs restored
		// from the memservers is unknown. Those are not backed (until trimmed); empty
		// slabs are zeroed in it.
		backup_->start(
			false, [](uint64_t) { return false; },
			[this](uint64_t i) { return slabs_[i].nrep == 0 && !slabs_[i].lost; });
		log->warn("backup {}: not closed cleanly by the previous run: the {} slabs restored "
			  "from memservers are not backed by it (losing their memservers loses them)",
			  o.backup_path, backup_->untrusted_count());
	}
}

bool Volume::valid(const Replica &r) const
{
	return r.gen == sstate_[r.server].gen.load() && servers_[r.server]->session_alive();
}

unsigned Volume::valid_count(const Slab &s) const
{
	unsigned n = 0;
	for (unsigned i = 0; i < s.nrep; i++)
		n += valid(s.rep[i]);
	return n;
}

void Volume::kick_repair()
{
	{
		std::lock_guard lock(repair_mu_);
		repair_kick_ = true;
	}
	repair_cv_.notify_all();
}

void Volume::mark_down(uint16_t server)
{
	sstate_[server].down_until.store(
		now_ns() +
		std::chrono::duration_cast<std::chrono::nanoseconds>(down_cooldown_).count());
}

bool Volume::is_down(uint16_t server) const
{
	return now_ns() < sstate_[server].down_until.load();
}

void Volume::invalidate(uint16_t server)
{
	// Every replica on this server may now miss a write: none of them is read again.
	sstate_[server].gen.fetch_add(1);
	mark_down(server);
	server_failures_.fetch_add(1);
	logger("volume")->warn("memserver {} failed: its replicas are invalid; reads and writes "
			       "go on with the other replicas",
			       servers_[server]->name());
	kick_repair();
}

Volume::ChannelRef Volume::channel()
{
	// A request takes the first free channel from its thread's usual one on, so that busy
	// channels (a slow donor, a long request) never hold up a request while others idle.
	const size_t n = channels_.size();
	const size_t start = thread_index() % n;
	for (size_t i = 0; i < n; i++) {
		Channel &c = *channels_[(start + i) % n];
		if (c.mu.try_lock())
			return ChannelRef(&c);
	}
	Channel &c = *channels_[start];
	if (c.mu.try_lock_until(deadline()))
		return ChannelRef(&c);
	lock_timeouts_.fetch_add(1, std::memory_order_relaxed);
	logger("volume")->debug("no data channel came free within the timeout");
	return ChannelRef();
}

Volume::Channel &Volume::stripe() const
{
	return *channels_[thread_index() % channels_.size()];
}

int Volume::count_error(VolumeOp op, int err)
{
	if (err) {
		const VolumeErr kind = err == EIO      ? VolumeErr::Eio
				       : err == ENOSPC ? VolumeErr::Enospc
				       : err == EINVAL ? VolumeErr::Einval
						       : VolumeErr::Other;
		errors_[size_t(op)][size_t(kind)].fetch_add(1, std::memory_order_relaxed);
	}
	return err;
}

int Volume::check_range(uint64_t count, uint64_t offset) const
{
	if (offset > size_ || size_ - offset < count)
		return EINVAL;
	return 0;
}

uint32_t Volume::chunk_len(uint64_t at, uint64_t left) const
{
	// Bounded by the channel buffer, and by kMaxPieces slabs so one chunk never posts more
	// than kMaxBatch operations to one data path.
	const uint64_t limit = (at / slab_size_ + kMaxPieces) * slab_size_ - at;
	return uint32_t(std::min<uint64_t>({left, buffer_size_, limit}));
}

unsigned Volume::split(uint64_t offset, uint32_t len, Piece *out) const
{
	unsigned n = 0;
	uint32_t pos = 0;
	while (pos < len) {
		const uint64_t at = offset + pos;
		const uint64_t slab = at / slab_size_;
		const uint64_t off = at % slab_size_;
		const uint32_t piece = uint32_t(std::min<uint64_t>(len - pos, slab_size_ - off));
		out[n++] = Piece{slab, off, piece, pos};
		pos += piece;
	}
	return n;
}

} // namespace rdmaswap
