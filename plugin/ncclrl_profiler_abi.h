/*
 * ncclrl's declarations of the part of NCCL's profiler-plugin ABI v5 (NCCL 2.28 and 2.29), v6 (2.30,
 * 2.31: v5 plus Copy Engine members at the end of the union) and v7 (2.32: v6 plus members at the end
 * of the collective's struct, and kernel-phase events) that the online mode reads, written from the documented facts: the event-type bits, the kernel-channel
 * stop state, the descriptor's leading members and the collective and kernel-channel members of
 * its union, the state-argument union, and the plugin struct's member order. Nothing here is
 * copied from NCCL's headers.
 */
#ifndef NCCLRL_PROFILER_ABI_H
#define NCCLRL_PROFILER_ABI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ncclrl_tuner_abi.h"

/* event types (bits of the activation mask) */
enum { NCCLRL_PROFILE_COLL = 1 << 1, NCCLRL_PROFILE_KERNEL_CH = 1 << 6, NCCLRL_PROFILE_KERNEL_PHASE = 1 << 15 };
/* the state a kernel-channel event records when its channel's work is done (GPU timer in the args);
 * v7: the state a kernel-phase event records when its phase ends (the same argument member) */
enum { NCCLRL_PROFILER_KERNEL_CH_STOP = 22, NCCLRL_PROFILER_KERNEL_PHASE_STOP = 31 };
/* v7 kernel phases: waiting for the other ranks, the transfer itself, the closing barrier */
enum { NCCLRL_PHASE_INITIAL_SYNC = 0, NCCLRL_PHASE_COMPUTE = 1, NCCLRL_PHASE_FINAL_SYNC = 2 };

typedef struct {
  uint64_t type;   /* one event-type bit */
  void* parentObj; /* for a kernel-channel event: the handle of its collective's event */
  int rank;
  union {
    struct {
      uint64_t seqNumber;
      const char* func; /* "AllReduce", "AllGather", "ReduceScatter", "Broadcast", "Reduce", ... */
      const void* sendBuff;
      void* recvBuff;
      size_t count; /* elements per rank (the send side of AllGather, the receive side of ReduceScatter) */
      int root;
      const char* datatype; /* "ncclFloat32", ... */
      uint8_t nChannels;
      uint8_t nWarps;
      const char* algo;  /* "RING", "TREE", ... */
      const char* proto; /* "LL", "LL128", "SIMPLE" */
      void* parentGroup;
    } coll;
    struct {
      uint8_t channelId;
      uint64_t pTimer; /* GPU globaltimer at the channel's start, ns */
    } kernelCh;
    struct { /* v7: a phase of one kernel channel (its parent: that channel's event) */
      uint8_t channelId;
      uint8_t phaseId; /* NCCLRL_PHASE_* */
      const char* phaseName;
      uint64_t pTimer; /* GPU globaltimer at the phase's start, ns */
    } kernelPhase;
    char reserved[64];
  };
} ncclrl_profiler_descr_v5_t;

typedef union {
  struct {
    uint64_t pTimer; /* GPU globaltimer at the channel's stop, ns */
  } kernelCh;
  char reserved[16];
} ncclrl_profiler_state_args_v5_t;

typedef struct {
  const char* name;
  ncclrl_result_t (*init)(void** context, uint64_t commId, int* eActivationMask, const char* commName, int nNodes,
                          int nranks, int rank, ncclrl_logger_t logfn);
  ncclrl_result_t (*startEvent)(void* context, void** eHandle, ncclrl_profiler_descr_v5_t* eDescr);
  ncclrl_result_t (*stopEvent)(void* eHandle);
  ncclrl_result_t (*recordEventState)(void* eHandle, int eState, ncclrl_profiler_state_args_v5_t* eStateArgs);
  ncclrl_result_t (*finalize)(void* context);
} ncclrl_profiler_v5_t;

#endif
