// SPDX-License-Identifier: MIT
// Volume: slab map with replicas, per-thread channels, chunked I/O, failover and repair.
#include "common/volume.h"

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>

#include "common/log.h"
#include "common/placement.h"
#include "common/reattach.h"

namespace rdmaswap {

namespace {
// At most this many slabs are touched by one chunk, so one chunk never posts more than
// kMaxBatch operations to one data path (each piece posts at most once per server).
constexpr unsigned kMaxPieces = 8;
static_assert(kMaxPieces <= kMaxBatch);

std::atomic<unsigned> g_next_thread{0};
thread_local unsigned t_thread_index = g_next_thread.fetch_add(1);

int64_t now_ns()
{
	return std::chrono::duration_cast<std::chrono::nanoseconds>(
		       std::chrono::steady_clock::now().time_since_epoch())
		.count();
}
} // namespace

Volume::Volume(std::vector<std::unique_ptr<Server>> servers, const VolumeOptions &opts)
	: servers_(std::move(servers)), size_(opts.size), buffer_size_(opts.buffer_size),
	  repair_interval_(opts.repair_interval),
	  down_cooldown_(opts.down_cooldown), rng_(std::random_device{}())
{
	if (servers_.empty())
		throw std::runtime_error("a volume needs at least one memserver");
	if (servers_.size() > kMaxServers)
		throw std::runtime_error("at most " + std::to_string(kMaxServers) + " memservers");
	if (size_ == 0)
		throw std::runtime_error("volume size must be greater than 0");
	if (opts.channels == 0 || opts.channels > 1024)
		throw std::runtime_error("channels must be between 1 and 1024");
	if (opts.replicas == 0 || opts.replicas > kMaxReplicas)
		throw std::runtime_error("replicas must be between 1 and " +
					 std::to_string(kMaxReplicas));
	if (opts.replicas > servers_.size())
		throw std::runtime_error("replicas=" + std::to_string(opts.replicas) + " needs at least " +
					 std::to_string(opts.replicas) + " reachable memservers, have " +
					 std::to_string(servers_.size()));
	replicas_ = opts.replicas;
	slab_size_ = servers_[0]->info().slab_size;
	if (slab_size_ < 4096 || (slab_size_ & (slab_size_ - 1)) != 0)
		throw std::runtime_error("memserver " + servers_[0]->name() +
					 " reports a slab size that is not a power of two >= 4096");
	for (auto &s : servers_) {
		if (s->info().slab_size != slab_size_)
			throw std::runtime_error("memservers " + servers_[0]->name() + " and " +
						 s->name() + " use different slab sizes");
		if (s->info().max_io < buffer_size_)
			throw std::runtime_error("memserver " + s->name() +
						 " accepts smaller I/O than the channel buffer");
	}
	if (buffer_size_ == 0 || buffer_size_ % 4096 != 0 || buffer_size_ > proto::kMaxIo)
		throw std::runtime_error("channel buffer size must be a multiple of 4096 up to 1 MiB");
	nslabs_ = (size_ + slab_size_ - 1) / slab_size_;
	uint64_t capacity = 0;
	for (auto &s : servers_)
		capacity += uint64_t(s->info().slabs_total) * slab_size_;
	if (capacity < size_ * replicas_)
		logger("volume")->warn("volume of {} bytes x {} replicas is larger than the "
				       "memservers' total capacity of {} bytes: writes will fail "
				       "with ENOSPC when it is full",
				       size_, replicas_, capacity);
	slabs_ = std::make_unique<Slab[]>(nslabs_);
	sstate_ = std::make_unique<ServerState[]>(servers_.size());

	const unsigned nch = opts.channels + 1; // + the repair thread's
	region_len_ = buffer_size_ * nch;
	void *p = mmap(nullptr, region_len_, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
	if (p == MAP_FAILED)
		throw std::runtime_error(std::string("cannot map channel buffers: ") +
					 std::strerror(errno));
	region_ = static_cast<std::byte *>(p);
	if (mlock(region_, region_len_) != 0)
		logger("volume")->warn("cannot lock {} bytes of channel buffers: {}", region_len_,
				       std::strerror(errno));
	std::span<std::byte> region(region_, region_len_);
	try {
		for (unsigned i = 0; i < nch; i++) {
			auto ch = std::make_unique<Channel>();
			ch->buf = region_ + size_t(i) * buffer_size_;
			for (auto &s : servers_)
				ch->paths.push_back(s->open_data_path(region));
			channels_.push_back(std::move(ch));
		}
	} catch (...) {
		channels_.clear();
		munmap(region_, region_len_);
		throw;
	}
	tagged_ = true;
	for (auto &srv : servers_)
		tagged_ = tagged_ && srv->bound();
	if (tagged_) {
		try {
			recover(opts.missing_servers);
		} catch (...) {
			channels_.clear();
			munmap(region_, region_len_);
			throw;
		}
	}
	wanted_.resize(servers_.size());
	repair_thread_ = std::thread([this] { repair_loop(); });
	poll_thread_ = std::thread([this] { poll_loop(); });
}

void Volume::recover(unsigned missing)
{
	auto log = logger("volume");
	std::vector<FoundSlab> found;
	std::vector<FoundFloor> floors;
	unsigned reattached = 0;
	const unsigned unreachable = missing;
	for (size_t i = 0; i < servers_.size(); i++) {
		if (!servers_[i]->reattached()) {
			missing++;
			continue;
		}
		reattached++;
		std::vector<proto::VolumeEntry> sl, fl;
		if (int err = servers_[i]->list_volume(sl, fl))
			throw std::runtime_error("memserver " + servers_[i]->name() +
						 ": cannot list the slabs kept for the volume: " +
						 std::strerror(err));
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
		  plan.chunks.size(), degraded, reattached, servers_.size() + unreachable,
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

Volume::~Volume()
{
	{
		std::lock_guard lock(repair_mu_);
		stop_ = true;
	}
	repair_cv_.notify_all();
	if (repair_thread_.joinable())
		repair_thread_.join();
	if (poll_thread_.joinable())
		poll_thread_.join();
	channels_.clear(); // data paths reference the region: drop them first
	if (region_)
		munmap(region_, region_len_);
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

VolumeStats Volume::stats() const
{
	VolumeStats st;
	st.slabs = nslabs_;
	for (uint64_t i = 0; i < nslabs_; i++) {
		std::shared_lock lock(slabs_[i].mu);
		st.lost += slabs_[i].nrep == 0 && slabs_[i].lost;
		if (slabs_[i].nrep == 0)
			continue;
		st.slabs_live++;
		const unsigned v = valid_count(slabs_[i]);
		st.lost += v == 0;
		st.degraded += v > 0 && v < replicas_;
	}
	st.repaired = repaired_.load();
	st.repair_bytes = repair_bytes_.load();
	st.server_failures = server_failures_.load();
	st.epoch_raises = epoch_raises_.load();
	st.reattached = reattached_.load();
	st.reattach_stale = reattach_stale_.load();
	st.migrated = migrated_.load();
	st.migrate_bytes = migrate_bytes_.load();
	st.migrate_pending = migrate_pending_.load();
	st.migrate_ms = migrate_ns_.load() / 1000000;
	return st;
}

std::string Volume::status_text() const
{
	const VolumeStats st = stats();
	std::string out;
	auto kv = [&](const std::string &k, const std::string &v) { out += k + "=" + v + "\n"; };
	kv("size", std::to_string(size_));
	kv("slab_size", std::to_string(slab_size_));
	kv("replicas", std::to_string(replicas_));
	kv("slabs", std::to_string(st.slabs));
	kv("slabs_live", std::to_string(st.slabs_live));
	kv("degraded", std::to_string(st.degraded));
	kv("lost", std::to_string(st.lost));
	kv("repaired", std::to_string(st.repaired));
	kv("repair_bytes", std::to_string(st.repair_bytes));
	kv("server_failures", std::to_string(st.server_failures));
	kv("epoch_raises", std::to_string(st.epoch_raises));
	kv("reattached", std::to_string(st.reattached));
	kv("reattach_stale", std::to_string(st.reattach_stale));
	kv("migrated", std::to_string(st.migrated));
	kv("migrate_bytes", std::to_string(st.migrate_bytes));
	kv("migrate_ms", std::to_string(st.migrate_ms));
	kv("migrate_pending", std::to_string(st.migrate_pending));
	const int64_t now = now_ns();
	for (size_t i = 0; i < servers_.size(); i++) {
		const bool alive = servers_[i]->session_alive();
		const bool down = now < sstate_[i].down_until.load();
		kv("donor." + std::to_string(i),
		   servers_[i]->name() + " state=" + (!alive ? "lost" : down ? "failed" : "ok") +
			   " slabs=" + std::to_string(sstate_[i].used.load()) +
			   " generation=" + std::to_string(sstate_[i].gen.load()) +
			   " free_on_donor=" + std::to_string(servers_[i]->slabs_free()));
	}
	return out;
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

Volume::Channel &Volume::channel()
{
	return *channels_[t_thread_index % (channels_.size() - 1)];
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

unsigned Volume::place(unsigned want, std::span<const uint16_t> exclude, uint16_t *out)
{
	DonorLoad loads[kMaxServers];
	std::lock_guard lock(place_mu_); // the rng; held for no network call
	const int64_t now = now_ns();
	auto fill = [&](bool allow_down) {
		for (size_t i = 0; i < servers_.size(); i++) {
			const ServerInfo &info = servers_[i]->info();
			const uint32_t free = servers_[i]->slabs_free();
			loads[i] = DonorLoad{info.slabs_total - std::min(free, info.slabs_total),
					     info.slabs_total,
					     servers_[i]->session_alive() &&
						     (allow_down || now >= sstate_[i].down_until.load())};
		}
	};
	fill(false);
	unsigned n = place_slab(std::span(loads, servers_.size()), want, exclude, rng_, out);
	if (n == 0) { // every donor with room recently failed: try them rather than give up
		fill(true);
		n = place_slab(std::span(loads, servers_.size()), want, exclude, rng_, out);
	}
	return n;
}

int Volume::allocate(Slab &s)
{
	// Donors that were tried (or hold a replica) are not chosen again; free counts are
	// always a little stale, so a donor that turns out full sends us to the next one.
	uint16_t tried[kMaxServers];
	unsigned ntried = 0;
	int err = ENOSPC;
	while (s.nrep < replicas_ && ntried < servers_.size()) {
		uint16_t chosen[kMaxReplicas];
		const unsigned n = place(replicas_ - s.nrep, std::span(tried, ntried), chosen);
		if (n == 0)
			break;
		for (unsigned k = 0; k < n; k++) {
			const uint16_t i = chosen[k];
			tried[ntried++] = i;
			SlabGrant g;
			const uint32_t gen = sstate_[i].gen.load();
			const int r = servers_[i]->alloc_tagged(uint64_t(&s - slabs_.get()), s.epoch, g);
			if (r == 0) {
				s.rep[s.nrep++] = Replica{i, gen, g, s.epoch};
				sstate_[i].used.fetch_add(1);
			} else if (r != ENOSPC) {
				err = EIO;
				mark_down(i);
			}
		}
	}
	if (s.nrep == 0)
		return err;
	if (s.nrep < replicas_)
		kick_repair(); // degraded from birth: the repair thread adds the missing copies
	return 0;
}

int Volume::lock_for_write(uint64_t slab)
{
	Slab &s = slabs_[slab];
	for (;;) {
		s.mu.lock_shared();
		if (s.nrep > 0)
			return 0;
		const bool lost = s.lost;
		s.mu.unlock_shared();
		if (lost)
			return EIO; // lost at reattach: a write must not make the rest read zeros
		std::unique_lock ex(s.mu);
		if (s.nrep == 0 && !s.lost) {
			if (int err = allocate(s)) {
				logger("volume")->error("cannot allocate slab {}: {}", slab,
							std::strerror(err));
				return err == ENOSPC ? ENOSPC : EIO;
			}
		}
		// Take it shared again (a trim may free it in between: then allocate again).
	}
}

int Volume::give_back(uint64_t slab)
{
	Slab &s = slabs_[slab];
	// Waits for I/O in flight on this slab (each bounded by the timeout).
	std::unique_lock ex(s.mu);
	bool confirmed = true;
	for (unsigned i = 0; i < s.nrep; i++)
		confirmed = release_replica(s.rep[i]) && confirmed;
	if (tagged_ && s.nrep && !confirmed) {
		// A donor may still hold a replica with our tag: a restart must not bring its bytes
		// back. Replicas written later get a higher epoch, and the floor makes the chunk
		// read EIO after a restart if nothing newer exists.
		s.epoch++;
		record_floor(slab, s.epoch, 0);
	}
	// The content is discarded either way; a slab a server kept is reclaimed when our
	// session ends (or by reconciliation after an unknown outcome).
	s.nrep = 0;
	s.lost = false; // trimmed whole: reads zeros from now on
	return 0;
}

bool Volume::release_replica(const Replica &r)
{
	sstate_[r.server].used.fetch_sub(1);
	Server &srv = *servers_[r.server];
	if (!srv.session_alive())
		return true; // gone with its session
	if (!valid(r)) { // its donor failed and may hang: do not wait on it
		srv.forget_slab(r.grant.id);
		return false;
	}
	if (int err = srv.free_slab(r.grant.id)) {
		logger("volume")->warn("memserver {} did not take back slab {}: {}", srv.name(),
				       r.grant.id, std::strerror(err));
		return false;
	}
	return true;
}

void Volume::record_floor(uint64_t slab, uint64_t epoch, uint64_t skip)
{
	const int64_t now = now_ns();
	for (size_t i = 0; i < servers_.size(); i++) {
		if (skip & (uint64_t(1) << i) || !servers_[i]->session_alive() ||
		    now < sstate_[i].down_until.load())
			continue;
		if (int err = servers_[i]->set_floor(slab, epoch))
			logger("volume")->debug("slab {}: floor on {} not recorded: {}", slab,
						servers_[i]->name(), std::strerror(err));
	}
}

int Volume::read_chunk(Channel &ch, uint64_t at, uint32_t len)
{
	Piece pieces[kMaxPieces];
	const unsigned n = split(at, len, pieces);
	for (unsigned i = 0; i < n; i++)
		slabs_[pieces[i].slab].mu.lock_shared();
	uint8_t tried[kMaxPieces] = {};   // replica indices tried, per piece
	int8_t posted[kMaxPieces];        // replica posted this round, -1 if none
	bool done[kMaxPieces] = {};
	int err = 0;
	for (unsigned round = 0; round <= kMaxReplicas && !err; round++) {
		uint64_t used = 0, post_failed = 0;
		for (unsigned i = 0; i < n && !err; i++) {
			posted[i] = -1;
			if (done[i])
				continue;
			const Piece &p = pieces[i];
			const Slab &s = slabs_[p.slab];
			if (s.nrep == 0 && s.lost) { // lost at reattach
				err = EIO;
				break;
			}
			if (s.nrep == 0) { // never written: zeros, no round trip
				std::memset(ch.buf + p.pos, 0, p.len);
				done[i] = true;
				continue;
			}
			int r = -1;
			for (unsigned k = 0; k < s.nrep && r < 0; k++)
				if (!(tried[i] & (1u << k)) && valid(s.rep[k]))
					r = int(k);
			if (r < 0) {
				err = EIO; // no valid replica left to read from
				break;
			}
			tried[i] |= uint8_t(1u << r);
			posted[i] = int8_t(r);
			const Replica &rep = s.rep[r];
			used |= uint64_t(1) << rep.server;
			if (ch.paths[rep.server]->post_read(rep.grant, p.off, p.len, ch.buf + p.pos))
				post_failed |= uint64_t(1) << rep.server;
		}
		if (!used)
			break;
		uint64_t failed = post_failed;
		for (size_t k = 0; k < servers_.size(); k++)
			if (used & (uint64_t(1) << k))
				if (ch.paths[k]->complete() != 0)
					failed |= uint64_t(1) << k;
		for (unsigned i = 0; i < n; i++) {
			if (posted[i] < 0)
				continue;
			const Slab &s = slabs_[pieces[i].slab];
			const uint16_t srv = s.rep[posted[i]].server;
			if (!(failed & (uint64_t(1) << srv))) {
				done[i] = true;
				continue;
			}
			// Another valid replica can serve it: stop using this donor.
			for (unsigned k = 0; k < s.nrep; k++)
				if (s.rep[k].server != srv && valid(s.rep[k])) {
					if (sstate_[srv].gen.load() == s.rep[posted[i]].gen)
						invalidate(srv);
					break;
				}
		}
	}
	for (unsigned i = 0; i < n; i++)
		if (!done[i])
			err = EIO;
	for (unsigned i = 0; i < n; i++)
		slabs_[pieces[i].slab].mu.unlock_shared();
	if (err)
		logger("volume")->debug("read of {} bytes at {} failed", len, at);
	return err;
}

int Volume::write_chunk(Channel &ch, uint64_t at, uint32_t len)
{
	Piece pieces[kMaxPieces];
	const unsigned n = split(at, len, pieces);
	unsigned locked = 0;
	int err = 0;
	for (; locked < n; locked++)
		if ((err = lock_for_write(pieces[locked].slab)))
			break;
	uint8_t posted[kMaxPieces] = {}; // replica indices written, per piece
	uint64_t used = 0, post_failed = 0;
	for (unsigned i = 0; i < locked && !err; i++) {
		const Piece &p = pieces[i];
		const Slab &s = slabs_[p.slab];
		for (unsigned k = 0; k < s.nrep; k++) {
			const Replica &rep = s.rep[k];
			if (!valid(rep))
				continue;
			posted[i] |= uint8_t(1u << k);
			used |= uint64_t(1) << rep.server;
			if (ch.paths[rep.server]->post_write(rep.grant, p.off, p.len, ch.buf + p.pos))
				post_failed |= uint64_t(1) << rep.server;
		}
	}
	uint64_t failed = post_failed;
	for (size_t k = 0; k < servers_.size(); k++)
		if (used & (uint64_t(1) << k))
			if (ch.paths[k]->complete() != 0)
				failed |= uint64_t(1) << k;
	// A replica that failed a write another replica took now differs from it: invalidate
	// its donor. (If every replica failed, the range is simply unspecified, as after any
	// failed write, and the request fails.)
	for (unsigned i = 0; i < locked && failed; i++) {
		const Slab &s = slabs_[pieces[i].slab];
		bool took = false;
		for (unsigned k = 0; k < s.nrep; k++)
			took = took || ((posted[i] & (1u << k)) &&
					!(failed & (uint64_t(1) << s.rep[k].server)));
		if (!took)
			continue;
		for (unsigned k = 0; k < s.nrep; k++)
			if ((posted[i] & (1u << k)) && (failed & (uint64_t(1) << s.rep[k].server)) &&
			    sstate_[s.rep[k].server].gen.load() == s.rep[k].gen)
				invalidate(s.rep[k].server);
	}
	// Done only if some replica that took the write is still valid afterwards (a replica
	// invalidated meanwhile may have missed an earlier write).
	for (unsigned i = 0; i < locked && !err; i++) {
		const Slab &s = slabs_[pieces[i].slab];
		uint8_t took = 0;
		unsigned ntook = 0;
		for (unsigned k = 0; k < s.nrep; k++)
			if ((posted[i] & (1u << k)) &&
			    !(failed & (uint64_t(1) << s.rep[k].server)) && valid(s.rep[k])) {
				took |= uint8_t(1u << k);
				ntook++;
			}
		if (ntook == 0)
			err = EIO;
		else if (tagged_ && ntook < replicas_) // degraded: never on the normal path
			err = fence_stale(pieces[i].slab, took);
	}
	for (unsigned i = 0; i < locked; i++)
		slabs_[pieces[i].slab].mu.unlock_shared();
	if (err)
		logger("volume")->debug("write of {} bytes at {} failed: {}", len, at,
					std::strerror(err));
	return err;
}

int Volume::pread(void *buf, uint32_t count, uint64_t offset)
{
	if (int r = check_range(count, offset))
		return r;
	Channel &ch = channel();
	std::lock_guard lock(ch.mu);
	auto *dst = static_cast<std::byte *>(buf);
	uint64_t done = 0;
	while (done < count) {
		const uint64_t at = offset + done;
		const uint32_t len = chunk_len(at, count - done);
		if (int r = read_chunk(ch, at, len))
			return r;
		std::memcpy(dst + done, ch.buf, len);
		done += len;
	}
	return 0;
}

int Volume::pwrite(const void *buf, uint32_t count, uint64_t offset)
{
	if (int r = check_range(count, offset))
		return r;
	Channel &ch = channel();
	std::lock_guard lock(ch.mu);
	const auto *src = static_cast<const std::byte *>(buf);
	uint64_t done = 0;
	while (done < count) {
		const uint64_t at = offset + done;
		const uint32_t len = chunk_len(at, count - done);
		std::memcpy(ch.buf, src + done, len);
		if (int r = write_chunk(ch, at, len))
			return r;
		done += len;
	}
	return 0;
}

int Volume::trim(uint32_t count, uint64_t offset)
{
	if (int r = check_range(count, offset))
		return r;
	const uint64_t end = offset + count;
	// Whole slabs only; the volume's last slab counts as whole when the range reaches the end.
	const uint64_t first = (offset + slab_size_ - 1) / slab_size_;
	const uint64_t last = (end == size_) ? nslabs_ : end / slab_size_;
	int err = 0;
	for (uint64_t i = first; i < last; i++)
		if (int r = give_back(i); r && !err)
			err = r;
	return err;
}

int Volume::zero(uint32_t count, uint64_t offset, bool fast_only)
{
	if (int r = check_range(count, offset))
		return r;
	if (count == 0)
		return 0;
	const uint64_t end = offset + count;
	const uint64_t first = (offset + slab_size_ - 1) / slab_size_;
	const uint64_t last = (end == size_) ? nslabs_ : end / slab_size_;
	// The partial head and tail (if any) need zeros written where their slab holds data.
	struct Range { uint64_t at, len; } partial[2];
	unsigned np = 0;
	if (first >= last) {
		partial[np++] = {offset, count};
	} else {
		if (offset < first * slab_size_)
			partial[np++] = {offset, first * slab_size_ - offset};
		if (last * slab_size_ < end)
			partial[np++] = {last * slab_size_, end - last * slab_size_};
	}
	auto has_data = [&](uint64_t slab) {
		std::shared_lock lock(slabs_[slab].mu);
		return slabs_[slab].nrep != 0;
	};
	auto needs_write = [&](const Range &r) {
		for (uint64_t s = r.at / slab_size_; s <= (r.at + r.len - 1) / slab_size_; s++)
			if (has_data(s))
				return true;
		return false;
	};
	if (fast_only)
		for (unsigned i = 0; i < np; i++)
			if (needs_write(partial[i]))
				return ENOTSUP;
	int err = 0;
	if (first < last)
		err = trim(uint32_t(std::min<uint64_t>(end, last * slab_size_) - first * slab_size_),
			   first * slab_size_);
	Channel &ch = channel();
	std::lock_guard lock(ch.mu);
	for (unsigned i = 0; i < np && !err; i++) {
		// Zeros go only to slabs that hold data: an empty slab already reads as zeros.
		uint64_t done = 0;
		while (done < partial[i].len && !err) {
			const uint64_t at = partial[i].at + done;
			const uint32_t len = uint32_t(std::min<uint64_t>(
				{partial[i].len - done, buffer_size_, slab_size_ - at % slab_size_}));
			if (has_data(at / slab_size_)) {
				std::memset(ch.buf, 0, len);
				err = write_chunk(ch, at, len);
			}
			done += len;
		}
	}
	return err;
}

int Volume::fence_stale(uint64_t slab, uint8_t took)
{
	Slab &s = slabs_[slab];
	std::lock_guard lock(s.epoch_mu);
	uint64_t min_took = UINT64_MAX, max_other = 0, max_all = 0;
	for (unsigned k = 0; k < s.nrep; k++) {
		const uint64_t e = s.rep[k].epoch;
		if (took & (1u << k))
			min_took = std::min(min_took, e);
		else
			max_other = std::max(max_other, e);
		max_all = std::max(max_all, e);
	}
	if (min_took > max_other && s.floored >= min_took)
		return 0; // fenced already (by an earlier write since the replica set shrank)
	const uint64_t target = min_took > max_other ? min_took : max_all + 1;
	uint64_t holders = 0; // servers whose replica now carries `target`
	for (unsigned k = 0; k < s.nrep; k++) {
		if (!(took & (1u << k)))
			continue;
		Replica &r = s.rep[k];
		if (r.epoch != target) {
			if (int err = servers_[r.server]->set_tag(r.grant.id, slab, target)) {
				logger("volume")->debug("slab {}: raising the epoch on {} failed: {}", slab,
							servers_[r.server]->name(), std::strerror(err));
				if (sstate_[r.server].gen.load() == r.gen)
					invalidate(r.server);
				took &= uint8_t(~(1u << k));
				continue;
			}
			r.epoch = target;
		}
		holders |= uint64_t(1) << r.server;
	}
	if (!holders)
		return EIO; // no replica that took the write could be marked newest
	if (target != min_took)
		epoch_raises_.fetch_add(1);
	s.epoch = target;
	// Witnesses: the other donors (not those holding a replica of this slab, which are
	// stale or failed) learn the floor, so that a restart that finds only an older replica
	// knows it is stale. Best effort, and skipped for donors on cooldown (they may hang).
	uint64_t others = 0;
	for (unsigned k = 0; k < s.nrep; k++)
		others |= uint64_t(1) << s.rep[k].server;
	record_floor(slab, target, holders | others);
	s.floored = target;
	return 0;
}

bool Volume::copy_slab(Channel &ch, const Replica &src, uint16_t dst, const SlabGrant &g,
			std::atomic<uint64_t> &bytes)
{
	for (uint64_t off = 0; off < slab_size_; off += buffer_size_) {
		const uint32_t len = uint32_t(std::min<uint64_t>(buffer_size_, slab_size_ - off));
		ch.paths[src.server]->post_read(src.grant, off, len, ch.buf);
		if (ch.paths[src.server]->complete() != 0) {
			mark_down(src.server);
			return false;
		}
		ch.paths[dst]->post_write(g, off, len, ch.buf);
		if (ch.paths[dst]->complete() != 0) {
			mark_down(dst);
			return false;
		}
		bytes.fetch_add(len);
	}
	return true;
}

bool Volume::migrate(uint64_t slab, uint16_t server, uint32_t id, Channel &ch)
{
	Slab &s = slabs_[slab];
	Replica old;
	{
		std::unique_lock ex(s.mu);
		int k = -1;
		for (unsigned i = 0; i < s.nrep; i++)
			if (s.rep[i].server == server && s.rep[i].grant.id == id)
				k = int(i);
		if (k < 0)
			return true; // trimmed or repaired meanwhile: nothing of ours to move
		// The source: a valid replica on another donor if there is one, else the wanted
		// replica itself (replicas=1: it is still valid and still served).
		int src = -1;
		for (unsigned i = 0; i < s.nrep; i++)
			if (valid(s.rep[i]) && (src < 0 || int(i) != k))
				src = int(i);
		if (src < 0)
			return false; // lost: keep the replica so that reads fail with EIO
		if (!valid(s.rep[k])) {
			// A stale copy: the repair drops it (raising the epoch of the good ones first
			// when the volume is bound) and restores the count; nothing to move.
			kick_repair();
			return true;
		}
		// Not onto a donor holding a copy (the one asking among them); a donor that turns
		// out full sends us to the next one, as in allocate().
		uint16_t exclude[kMaxServers];
		unsigned nex = 0;
		for (unsigned i = 0; i < s.nrep; i++)
			exclude[nex++] = s.rep[i].server;
		uint16_t dst;
		uint32_t gen;
		SlabGrant g;
		for (;;) {
			if (nex >= servers_.size() || place(1, std::span(exclude, nex), &dst) == 0)
				return false; // no other donor has room: the slab stays where it is
			exclude[nex++] = dst;
			gen = sstate_[dst].gen.load();
			// Epoch 0 until the copy is complete (bound volumes): a restart never trusts a
			// half copy.
			const int err = servers_[dst]->alloc_tagged(slab, 0, g);
			if (err == 0)
				break;
			if (err != ENOSPC)
				mark_down(dst);
		}
		sstate_[dst].used.fetch_add(1);
		const Replica from = s.rep[src];
		const int64_t t0 = now_ns();
		bool ok = copy_slab(ch, from, dst, g, migrate_bytes_);
		migrate_ns_.fetch_add(uint64_t(now_ns() - t0));
		if (ok && tagged_ && servers_[dst]->set_tag(g.id, slab, s.epoch) != 0) {
			mark_down(dst);
			ok = false;
		}
		if (!ok || !valid(from)) {
			ex.unlock();
			release_replica(Replica{dst, gen, g, 0});
			return false; // try again at the next pass
		}
		old = s.rep[k];
		s.rep[k] = Replica{dst, gen, g, s.epoch};
	}
	// Switched over: only now give the old slab back (the donor then withdraws it).
	release_replica(old);
	migrated_.fetch_add(1);
	return true;
}

uint64_t Volume::migrate_wanted(Channel &ch)
{
	uint64_t stuck = 0;
	std::vector<uint32_t> ids; // control path: allocating is fine
	for (size_t i = 0; i < servers_.size(); i++) {
		{
			// The poller's latest list (slabs moved since are simply not found below).
			std::lock_guard lock(wanted_mu_);
			ids = wanted_[i];
		}
		if (ids.empty() || !servers_[i]->session_alive())
			continue;
		std::sort(ids.begin(), ids.end());
		const uint64_t moved_before = migrated_.load();
		const uint64_t bytes_before = migrate_bytes_.load();
		const auto started = std::chrono::steady_clock::now();
		for (uint64_t slab = 0; slab < nslabs_; slab++) {
			uint32_t id = 0;
			bool hit = false;
			{
				std::shared_lock lock(slabs_[slab].mu);
				for (unsigned k = 0; k < slabs_[slab].nrep && !hit; k++) {
					const Replica &r = slabs_[slab].rep[k];
					if (r.server == i &&
					    std::binary_search(ids.begin(), ids.end(), r.grant.id)) {
						id = r.grant.id;
						hit = true;
					}
				}
			}
			if (!hit)
				continue;
			if (!migrate(slab, uint16_t(i), id, ch))
				stuck++;
			std::lock_guard lock(repair_mu_);
			if (stop_)
				return stuck;
		}
		if (const uint64_t n = migrated_.load() - moved_before) {
			const double secs = std::chrono::duration<double>(
						    std::chrono::steady_clock::now() - started)
						    .count();
			const double mib = double(migrate_bytes_.load() - bytes_before) / (1 << 20);
			logger("volume")->info("give-back: moved {} slabs ({:.0f} MiB) off memserver "
					       "{} in {:.2f} s ({:.0f} MiB/s); {} moved so far",
					       n, mib, servers_[i]->name(), secs,
					       secs > 0 ? mib / secs : 0.0, migrated_.load());
		}
	}
	return stuck;
}

void Volume::poll_loop()
{
	// One list per server, kept across polls: its capacity (the server's slab count) is
	// allocated at the first poll, which runs at once, before any I/O. Later polls reuse it,
	// and an empty answer (no give-back under way) is copied out without allocating.
	std::vector<std::vector<uint32_t>> polled(servers_.size());
	for (bool first = true;; first = false) {
		if (!first) {
			std::unique_lock lock(repair_mu_);
			repair_cv_.wait_for(lock, repair_interval_, [this] { return stop_; });
			if (stop_)
				return;
		}
		bool any = false;
		const int64_t now = now_ns();
		for (size_t i = 0; i < servers_.size(); i++) {
			if (now < sstate_[i].down_until.load() || !servers_[i]->session_alive())
				continue;
			std::vector<uint32_t> &ids = polled[i];
			if (const int err = servers_[i]->wanted_slabs(ids)) {
				// Hung or gone: do not wait on it again for a while.
				logger("volume")->warn("give-back: asking memserver {} which slabs it "
						       "wants back failed: {}",
						       servers_[i]->name(), std::strerror(err));
				mark_down(uint16_t(i));
				continue;
			}
			any = any || !ids.empty();
			std::lock_guard lock(wanted_mu_);
			wanted_[i].assign(ids.begin(), ids.end());
		}
		if (any)
			kick_repair();
	}
}

bool Volume::repair(uint64_t slab, Channel &ch)
{
	auto log = logger("volume");
	Slab &s = slabs_[slab];
	Replica drop[kMaxReplicas]; // invalid replicas to give back after unlocking
	unsigned ndrop = 0;
	bool changed = false;
	{
		std::unique_lock ex(s.mu);
		if (s.nrep == 0)
			return false;
		if (tagged_) {
			// Invalid replicas leave the set below, but their donors may still hold them
			// (a hung donor): the good ones get a higher epoch first, so that a restart
			// never takes a dropped replica for a current one.
			uint8_t goodmask = 0;
			for (unsigned i = 0; i < s.nrep; i++)
				goodmask |= uint8_t(valid(s.rep[i]) << i);
			if (goodmask && goodmask != (1u << s.nrep) - 1)
				fence_stale(slab, goodmask); // a donor failing it is invalidated
		}
		Replica good[kMaxReplicas];
		unsigned ngood = 0;
		for (unsigned i = 0; i < s.nrep; i++)
			(valid(s.rep[i]) ? good[ngood++] : drop[ndrop++]) = s.rep[i];
		if (ngood == 0)
			return false; // lost: keep the invalid replicas so reads fail with EIO
		// Place the missing copies away from the donors that hold a good one.
		uint16_t exclude[kMaxReplicas];
		for (unsigned i = 0; i < ngood; i++)
			exclude[i] = good[i].server;
		uint16_t chosen[kMaxReplicas];
		const unsigned n =
			ngood < replicas_ ? place(replicas_ - ngood, std::span(exclude, ngood), chosen) : 0;
		for (unsigned k = 0; k < n; k++) {
			const uint16_t dst = chosen[k];
			const uint32_t gen = sstate_[dst].gen.load();
			SlabGrant g;
			// Epoch 0 until the copy is complete: a restart never trusts a half copy.
			if (servers_[dst]->alloc_tagged(slab, 0, g) != 0)
				continue;
			sstate_[dst].used.fetch_add(1);
			// Copy the whole slab from a good replica; no write can run meanwhile (we hold
			// the slab exclusively).
			const Replica &src = good[0];
			bool ok = copy_slab(ch, src, dst, g, repair_bytes_);
			if (ok && tagged_ && servers_[dst]->set_tag(g.id, slab, s.epoch) != 0) {
				mark_down(dst);
				ok = false;
			}
			if (!ok || !valid(src)) {
				drop[ndrop++] = Replica{dst, gen, g, 0};
				break; // source or destination failed: try again on the next pass
			}
			good[ngood++] = Replica{dst, gen, g, s.epoch};
			repaired_.fetch_add(1);
			changed = true;
		}
		if (changed || ndrop) {
			for (unsigned i = 0; i < ngood; i++)
				s.rep[i] = good[i];
			s.nrep = uint8_t(ngood);
			changed = true;
		}
	}
	for (unsigned i = 0; i < ndrop; i++)
		release_replica(drop[i]);
	return changed;
}

void Volume::repair_loop()
{
	auto log = logger("volume");
	Channel &ch = *channels_.back();
	uint64_t last_logged = 0;
	for (;;) {
		{
			std::unique_lock lock(repair_mu_);
			repair_cv_.wait_for(lock, repair_interval_,
					    [this] { return stop_ || repair_kick_; });
			if (stop_)
				return;
			repair_kick_ = false;
		}
		// Give back slabs forgotten on donors that failed, once they answer again.
		const int64_t now = now_ns();
		for (size_t i = 0; i < servers_.size(); i++)
			if (now >= sstate_[i].down_until.load())
				servers_[i]->housekeeping();
		std::lock_guard chl(ch.mu);
		// Give-back: move the slabs donors want back, before anything else.
		const uint64_t stuck = migrate_wanted(ch);
		if (stuck > migrate_pending_.load())
			log->warn("give-back: {} slabs wanted back by their memserver cannot move (no "
				  "other memserver has room, or no valid copy to move); they stay where "
				  "they are and are moved when they can be",
				  stuck);
		migrate_pending_.store(stuck);
		if (replicas_ < 2)
			continue;
		for (uint64_t i = 0; i < nslabs_; i++) {
			{
				std::shared_lock lock(slabs_[i].mu);
				if (slabs_[i].nrep == 0 ||
				    (valid_count(slabs_[i]) >= replicas_ &&
				     valid_count(slabs_[i]) == slabs_[i].nrep))
					continue;
			}
			repair(i, ch);
			std::lock_guard lock(repair_mu_);
			if (stop_)
				return;
		}
		const uint64_t done = repaired_.load();
		if (done != last_logged) {
			const VolumeStats st = stats();
			log->info("repair: {} replicas re-created so far ({} bytes copied); {} slabs "
				  "degraded, {} lost",
				  done, st.repair_bytes, st.degraded, st.lost);
			last_logged = done;
		}
	}
}

} // namespace rdmaswap
