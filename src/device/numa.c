/* NUMA placement with hwloc. Everything is best effort: a failure to bind
 * costs bandwidth, never correctness, so it is reported, not returned. */
#include "device/numa.h"

#include <hwloc.h>
#include <pthread.h>
#include <stdio.h>

/* hwloc's PCI discovery goes through libudev, whose one-time global setup
 * is not thread-safe (ThreadSanitizer caught two contexts created at once):
 * one topology load at a time. Contexts are made rarely; this costs nothing. */
static pthread_mutex_t load_mu = PTHREAD_MUTEX_INITIALIZER;
/* Held across fork, so that a child never inherits it locked. */
static void load_lock(void) { pthread_mutex_lock(&load_mu); }
static void load_unlock(void) { pthread_mutex_unlock(&load_mu); }
__attribute__((constructor)) static void load_atfork(void) { pthread_atfork(load_lock, load_unlock, load_unlock); }

int ckptio_numa_place(const char *busid, void *mem, size_t bytes, const pthread_t *threads,
                      int nthreads, char *report, size_t len) {
  hwloc_topology_t topo;
  int placed = 0;
  if (!busid || (!mem && bytes) || nthreads < 0) return -1;
  if (hwloc_topology_init(&topo) < 0) {
    snprintf(report, len, "NUMA: hwloc topology unavailable; nothing placed");
    return 0;
  }
  /* PCI devices are filtered out by default; the GPU's is what we need. */
  hwloc_topology_set_io_types_filter(topo, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
  pthread_mutex_lock(&load_mu);
  int loaded = hwloc_topology_load(topo);
  pthread_mutex_unlock(&load_mu);
  if (loaded < 0) {
    snprintf(report, len, "NUMA: hwloc could not load the topology; nothing placed");
    goto out;
  }
  int nodes = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_NUMANODE);
  if (nodes <= 1) {
    snprintf(report, len, "NUMA: one node on this machine; nothing to place");
    goto out;
  }
  hwloc_obj_t pci = hwloc_get_pcidev_by_busidstring(topo, busid);
  hwloc_obj_t near = pci ? hwloc_get_non_io_ancestor_obj(topo, pci) : NULL;
  if (!near || !near->nodeset || !near->cpuset) {
    snprintf(report, len, "NUMA: GPU %s not found in the topology; nothing placed", busid);
    goto out;
  }
  int mem_ok = bytes == 0 ||
               hwloc_set_area_membind(topo, mem, bytes, near->nodeset, HWLOC_MEMBIND_BIND,
                                      HWLOC_MEMBIND_MIGRATE | HWLOC_MEMBIND_BYNODESET) == 0;
  int threads_ok = 0;
  for (int i = 0; i < nthreads; i++) threads_ok += hwloc_set_thread_cpubind(topo, threads[i], near->cpuset, 0) == 0;
  char nodes_str[64];
  hwloc_bitmap_snprintf(nodes_str, sizeof(nodes_str), near->nodeset);
  snprintf(report, len, "NUMA: GPU %s is local to node(s) %s: staging %s, %d of %d workers bound", busid,
           nodes_str, mem_ok ? "bound" : "NOT bound", threads_ok, nthreads);
  placed = mem_ok && threads_ok == nthreads;
out:
  hwloc_topology_destroy(topo);
  return placed;
}
