/**
 * A client of the rate-limiter module for Node.js, with the `lua-reference/` scripts and the
 * Functions library as fallbacks where the module is not loaded; Express middleware, a Fastify
 * plugin and an express-rate-limit store.
 *
 * - {@link Client}: mode detection, per-call timeouts and abort signals, failure policies, a
 *   circuit breaker; `check`, `checkAll`, `acquire` (leases), `reserve` (settled with the actual
 *   cost), `settle`, `top`.
 * - {@link redisRateLimit}: the Express middleware; {@link fastifyRateLimit}: the Fastify plugin.
 * - {@link RateLimitStore}: express-rate-limit's store on `RL.FIXEDWINDOW`.
 */

export {
  type Algorithm,
  type Concurrency,
  type FixedWindow,
  type Gcra,
  type LeakyBucket,
  type Limit,
  type SlidingLog,
  type SlidingWindow,
  type TokenBucket,
  commandOf,
  concurrency,
  fixedWindow,
  gcra,
  keywordOf,
  leakyBucket,
  limitOf,
  paramsOf,
  plainNumber,
  ratePerSec,
  slidingLog,
  slidingWindow,
  tokenBucket,
  windowSecs,
} from './algorithm.js';
export {
  Client,
  Limiter,
  type LeaseOutcome,
  type MultiLeaseOutcome,
  type MultiReservationOutcome,
  type ReservationOutcome,
  newLeaseId,
} from './client.js';
export {
  type Connection,
  type ConnectionSource,
  type IORedisCommandClass,
  type IORedisLike,
  type NodeRedisClientLike,
  type NodeRedisClusterLike,
  RedisReplyError,
  type Reply,
  type SendCommandClusterFn,
  type SendCommandFn,
  fromIORedis,
  fromNodeRedis,
  fromSendCommand,
  fromSendCommandCluster,
  isReplyError,
  keySlot,
  toConnection,
} from './connection.js';
export { type BatchStats, type Batching } from './batch.js';
export { Lease } from './lease.js';
export {
  type Counts,
  type LocalLabel,
  Metrics,
  type PromRegistry,
  exposeBreakerToPrometheus,
  exposeToPrometheus,
  renderBreakerGauge,
} from './metrics.js';
export { Reservation } from './reservation.js';
export { BUNDLED_SCRIPTS, LIBRARY, LIBRARY_NAME } from './scripts.js';
export {
  type BreakerOptions,
  type CallOptions,
  type ClientOptions,
  type Decision,
  type Degraded,
  type Durability,
  type DurabilityStats,
  type FailurePolicy,
  type LocalAnswer,
  type Mode,
  type MultiOutcome,
  type Outcome,
  RateLimitError,
  RejectedError,
  type Settlement,
  type ShortAck,
  type TopEntry,
  UnavailableError,
  UnsupportedError,
} from './types.js';
export {
  type Admission,
  DENY_CACHE_ENTRIES,
  type Admitted,
  type ExpressRequestLike,
  type Fields,
  type HeaderFormat,
  type KeySource,
  type Label,
  type LimitsEntry,
  type Policy,
  type RateLimitInfo,
  type RateLimitOptions,
  type Refusal,
  type RequestLike,
  type ResponseLike,
  RateLimitEngine,
  actualCostOf,
  canonicalIp,
  pathOf,
  policy,
  rateLimitFields,
  rateLimitInfo,
  setActualCost,
} from './http/core.js';
export { type RateLimitMiddleware, rateLimit, redisRateLimit } from './http/express.js';
export {
  type FastifyInstanceLike,
  type FastifyRateLimitOptions,
  type FastifyRateLimitPlugin,
  type FastifyReplyLike,
  type FastifyRequestLike,
  fastifyRateLimit,
} from './http/fastify.js';
export {
  type ClientRateLimitInfo,
  RateLimitStore,
  type RateLimitStoreOptions,
  type StoreInitOptions,
} from './store.js';
