// SPDX-License-Identifier: MIT
// FloorMap and the mmap-backed memory resource under it.
#include "memserver/floors.h"

#include <sys/mman.h>
#include <unistd.h>

#include <new>

namespace rdmaswap {

namespace {

size_t pages(size_t bytes)
{
	static const size_t page = size_t(sysconf(_SC_PAGESIZE));
	return (bytes + page - 1) / page * page;
}

std::pmr::pool_options floor_pool_options()
{
	std::pmr::pool_options o;
	o.largest_required_pool_block = 64; // map nodes of 48 bytes: one pool
	return o;
}

} // namespace

MmapResource &MmapResource::instance()
{
	static MmapResource r;
	return r;
}

void *MmapResource::do_allocate(size_t bytes, size_t align)
{
	if (align > size_t(sysconf(_SC_PAGESIZE)))
		throw std::bad_alloc();
	void *p = mmap(nullptr, pages(bytes), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
		       -1, 0);
	if (p == MAP_FAILED)
		throw std::bad_alloc();
	return p;
}

void MmapResource::do_deallocate(void *p, size_t bytes, size_t)
{
	munmap(p, pages(bytes));
}

FloorMap::FloorMap() : pool(floor_pool_options(), &MmapResource::instance()), map(&pool) {}

} // namespace rdmaswap
