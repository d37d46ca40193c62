/*
 * ncclrl's declarations of NCCL's tuner-plugin ABI (versions 2 to 6), written from the documented
 * facts (shared/notes/nccl-facts.md section 1): member order, argument lists, enum values.
 * Only what a tuner needs; nothing here is copied from NCCL's headers.
 */
#ifndef NCCLRL_TUNER_ABI_H
#define NCCLRL_TUNER_ABI_H

#include <stddef.h>
#include <stdint.h>

/* ncclResult_t is an int-sized enum. */
typedef enum {
  NCCLRL_SUCCESS = 0,
  NCCLRL_SYSTEM_ERROR = 2,
  NCCLRL_INTERNAL_ERROR = 3,
  NCCLRL_INVALID_ARGUMENT = 4,
  NCCLRL_INVALID_USAGE = 5
} ncclrl_result_t;

/* Logger NCCL passes to init. */
typedef void (*ncclrl_logger_t)(int level, unsigned long flags, const char* file, int line, const char* fmt, ...);
enum { NCCLRL_LOG_WARN = 2, NCCLRL_LOG_INFO = 3, NCCLRL_LOG_TRACE = 5 };
enum { NCCLRL_SUBSYS_INIT = 0x1, NCCLRL_SUBSYS_TUNING = 0x40 };

/* collType values that reach a tuner. */
enum { NCCLRL_BROADCAST = 0, NCCLRL_REDUCE = 1, NCCLRL_ALLGATHER = 2, NCCLRL_REDUCESCATTER = 3, NCCLRL_ALLREDUCE = 4,
       NCCLRL_NUM_COLLS = 5 };
/* Algorithms (7 since NCCL 2.23) and protocols. */
enum { NCCLRL_TREE = 0, NCCLRL_RING = 1, NCCLRL_COLLNET_DIRECT = 2, NCCLRL_COLLNET_CHAIN = 3, NCCLRL_NVLS = 4,
       NCCLRL_NVLS_TREE = 5, NCCLRL_PAT = 6, NCCLRL_NUM_ALGOS = 7 };
enum { NCCLRL_LL = 0, NCCLRL_LL128 = 1, NCCLRL_SIMPLE = 2, NCCLRL_NUM_PROTOS = 3 };
#define NCCLRL_COST_IGNORE (-1.0f)

/* v5/v6 init extras. */
typedef struct {
  int nNvlDomains;
  int minRanksPerNvlDomain;
  int maxRanksPerNvlDomain;
} ncclrl_nvl_domain_info_v5_t;

typedef struct {
  double baseLatencies[7][3];
  double hwLatencies[3][7][3];
  double llMaxBws[4][3];
  double perChMaxRingLL128Bws[4][3];
  double perChMaxTreeLL128Bws[4][3];
  double perChMaxTreeBws[4][3];
  double perChMaxNVLSTreeBws[4][3];
} ncclrl_tuner_constants_v5_t;

/* v2: NCCL 2.21+ */
typedef struct {
  const char* name;
  ncclrl_result_t (*init)(size_t nRanks, size_t nNodes, ncclrl_logger_t logger, void** ctx);
  ncclrl_result_t (*getCollInfo)(void* ctx, int collType, size_t nBytes, int collNetSupport, int nvlsSupport,
                                 int numPipeOps, int* algorithm, int* protocol, int* nChannels);
  ncclrl_result_t (*destroy)(void* ctx);
} ncclrl_tuner_v2_t;

/* v3: NCCL 2.22+ (cost table instead of algorithm/protocol outputs) */
typedef struct {
  const char* name;
  ncclrl_result_t (*init)(size_t nRanks, size_t nNodes, ncclrl_logger_t logger, void** ctx);
  ncclrl_result_t (*getCollInfo)(void* ctx, int collType, size_t nBytes, int numPipeOps, float** collCostTable,
                                 int numAlgo, int numProto, int* nChannels);
  ncclrl_result_t (*destroy)(void* ctx);
} ncclrl_tuner_v3_t;

/* v4: NCCL 2.24+ (regBuff) */
typedef struct {
  const char* name;
  ncclrl_result_t (*init)(size_t nRanks, size_t nNodes, ncclrl_logger_t logger, void** ctx);
  ncclrl_result_t (*getCollInfo)(void* ctx, int collType, size_t nBytes, int numPipeOps, float** collCostTable,
                                 int numAlgo, int numProto, int regBuff, int* nChannels);
  ncclrl_result_t (*destroy)(void* ctx);
} ncclrl_tuner_v4_t;

/* v5: NCCL 2.28+ (commId, NVL domain info, editable constants; finalize) */
typedef struct {
  const char* name;
  ncclrl_result_t (*init)(void** ctx, uint64_t commId, size_t nRanks, size_t nNodes, ncclrl_logger_t logger,
                          ncclrl_nvl_domain_info_v5_t* nvl, ncclrl_tuner_constants_v5_t* constants);
  ncclrl_result_t (*getCollInfo)(void* ctx, int collType, size_t nBytes, int numPipeOps, float** collCostTable,
                                 int numAlgo, int numProto, int regBuff, int* nChannels);
  ncclrl_result_t (*finalize)(void* ctx);
} ncclrl_tuner_v5_t;

/* v6: NCCL 2.30+ (optional per-call chunk size) */
typedef struct {
  const char* name;
  ncclrl_result_t (*init)(void** ctx, uint64_t commId, size_t nRanks, size_t nNodes, ncclrl_logger_t logger,
                          ncclrl_nvl_domain_info_v5_t* nvl, ncclrl_tuner_constants_v5_t* constants);
  ncclrl_result_t (*getCollInfo)(void* ctx, int collType, size_t nBytes, int numPipeOps, float** collCostTable,
                                 int numAlgo, int numProto, int regBuff, int* nChannels);
  ncclrl_result_t (*finalize)(void* ctx);
  ncclrl_result_t (*getChunkSize)(void* ctx, int collType, size_t nBytes, int algo, int proto, int nChannels,
                                  size_t* chunkSize);
} ncclrl_tuner_v6_t;

/* v7: NCCL 2.32+ (v6's functions; the bandwidth constants gain a fifth compute-capability row) */
typedef struct {
  double baseLatencies[7][3];
  double hwLatencies[3][7][3];
  double llMaxBws[5][3];
  double perChMaxRingLL128Bws[5][3];
  double perChMaxTreeLL128Bws[5][3];
  double perChMaxTreeBws[5][3];
  double perChMaxNVLSTreeBws[5][3];
} ncclrl_tuner_constants_v7_t;

typedef struct {
  const char* name;
  ncclrl_result_t (*init)(void** ctx, uint64_t commId, size_t nRanks, size_t nNodes, ncclrl_logger_t logger,
                          ncclrl_nvl_domain_info_v5_t* nvl, ncclrl_tuner_constants_v7_t* constants);
  ncclrl_result_t (*getCollInfo)(void* ctx, int collType, size_t nBytes, int numPipeOps, float** collCostTable,
                                 int numAlgo, int numProto, int regBuff, int* nChannels);
  ncclrl_result_t (*finalize)(void* ctx);
  ncclrl_result_t (*getChunkSize)(void* ctx, int collType, size_t nBytes, int algo, int proto, int nChannels,
                                  size_t* chunkSize);
} ncclrl_tuner_v7_t;

#endif
