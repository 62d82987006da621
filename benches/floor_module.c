/* The module API's floor for a limiter that keeps one string per key: the server calls that an
 * admitted or a denied RL.TOKENBUCKET call makes on a hot key, in the same order and with values
 * of the same length, and nothing of the module's own work (no argument or value parsing, no
 * decision, no number formatting beyond the expiry's digits). `make bench` builds it and loads it
 * next to the rate-limiter module, so its rows show what no module command doing these writes
 * and replies can go below on that server.
 *
 *   FLOOR.ADMIT key [ttl_ms]  memory check, open, read the value in place, rewrite it in place
 *                    (or set it when absent), set the expiry ttl_ms ahead (1 by default, a full
 *                    token bucket's; a window's key lives for its window), signal and notify `set`
 *                    and `expire`, propagate `SET key value PXAT ms`, reply an array of five
 *                    integers
 *   FLOOR.DENY key   open, read the value in place, reply an array of five integers
 *   FLOOR.LOGDENY key  what a denied RL.SLIDINGLOG call on a one-entry log cannot skip: open,
 *                    read the expiry (a log without one is not the module's), read the newest
 *                    entry of the sorted set, reply an array of five integers
 *
 * Built against redismodule.h of the redis-module crate (see the Makefile's bench target). */

#include <string.h>
#include <time.h>

#include "redismodule.h"

/* The stored value of a hot-key token bucket after an admission: `<tokens> <ts µs>`. */
static const char VALUE[] = "99 1796156770512147";
#define VALUE_LEN (sizeof(VALUE) - 1)

static RedisModuleString *pxat;

static long long now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    return (long long)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

/* Decimal digits of a positive number into buf (at least 20 bytes); returns the length. */
static size_t digits(long long v, char *buf) {
    char tmp[20];
    size_t n = 0;
    do {
        tmp[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v > 0 && n < sizeof(tmp));
    for (size_t i = 0; i < n; i++) buf[i] = tmp[n - 1 - i];
    return n;
}

static int reply_five(RedisModuleCtx *ctx, const long long *values) {
    RedisModule_ReplyWithArray(ctx, 5);
    for (int i = 0; i < 5; i++) RedisModule_ReplyWithLongLong(ctx, values[i]);
    return REDISMODULE_OK;
}

static int floor_admit(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    static const long long admitted[5] = {1, 99, 0, 1, 100};
    if (argc != 2 && argc != 3) return RedisModule_WrongArity(ctx);
    long long ttl_ms = 1;
    if (argc == 3 && (RedisModule_StringToLongLong(argv[2], &ttl_ms) != REDISMODULE_OK ||
                      ttl_ms < 1 || ttl_ms > 100000000))
        return RedisModule_ReplyWithError(ctx, "ERR ttl_ms must be an integer from 1 to 100000000");
    if (RedisModule_GetUsedMemoryRatio() > 1)
        return RedisModule_ReplyWithError(ctx, "OOM command not allowed");
    RedisModuleKey *key = RedisModule_OpenKey(ctx, argv[1], REDISMODULE_READ | REDISMODULE_WRITE);
    int type = RedisModule_KeyType(key);
    if (type != REDISMODULE_KEYTYPE_STRING && type != REDISMODULE_KEYTYPE_EMPTY) {
        RedisModule_CloseKey(key);
        return RedisModule_ReplyWithError(ctx, REDISMODULE_ERRORMSG_WRONGTYPE);
    }
    int in_place = 0;
    if (type == REDISMODULE_KEYTYPE_STRING) {
        size_t len = 0;
        RedisModule_StringDMA(key, &len, REDISMODULE_READ);
        char *w = RedisModule_StringDMA(key, &len, REDISMODULE_WRITE);
        if (w != NULL && len == VALUE_LEN) {
            memcpy(w, VALUE, VALUE_LEN);
            in_place = 1;
        }
    }
    if (!in_place) {
        RedisModuleString *s = RedisModule_CreateString(ctx, VALUE, VALUE_LEN);
        RedisModule_StringSet(key, s);
        RedisModule_FreeString(ctx, s);
    }
    long long at = now_ms() + ttl_ms;
    RedisModule_SetAbsExpire(key, at);
    RedisModule_SignalModifiedKey(ctx, argv[1]);
    RedisModule_NotifyKeyspaceEvent(ctx, REDISMODULE_NOTIFY_STRING, "set", argv[1]);
    RedisModule_NotifyKeyspaceEvent(ctx, REDISMODULE_NOTIFY_GENERIC, "expire", argv[1]);
    char ms[20];
    size_t ms_len = digits(at, ms);
    RedisModule_Replicate(ctx, "SET", "sbsb", argv[1], VALUE, VALUE_LEN, pxat, ms, ms_len);
    reply_five(ctx, admitted);
    RedisModule_CloseKey(key);
    return REDISMODULE_OK;
}

static int floor_deny(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    static const long long denied[5] = {0, 0, 999996, 999996, 1};
    if (argc != 2) return RedisModule_WrongArity(ctx);
    RedisModuleKey *key = RedisModule_OpenKey(ctx, argv[1], REDISMODULE_READ | REDISMODULE_WRITE);
    if (RedisModule_KeyType(key) == REDISMODULE_KEYTYPE_STRING) {
        size_t len = 0;
        RedisModule_StringDMA(key, &len, REDISMODULE_READ);
    }
    reply_five(ctx, denied);
    RedisModule_CloseKey(key);
    return REDISMODULE_OK;
}

static int floor_log_deny(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    static const long long denied[5] = {0, 0, 999996, 999996, 1};
    if (argc != 2) return RedisModule_WrongArity(ctx);
    RedisModuleKey *key = RedisModule_OpenKey(ctx, argv[1], REDISMODULE_READ | REDISMODULE_WRITE);
    if (RedisModule_KeyType(key) == REDISMODULE_KEYTYPE_ZSET &&
        RedisModule_GetAbsExpire(key) != REDISMODULE_NO_EXPIRE &&
        RedisModule_ValueLength(key) > 0 &&
        RedisModule_ZsetLastInScoreRange(key, REDISMODULE_NEGATIVE_INFINITE,
                                         REDISMODULE_POSITIVE_INFINITE, 0, 0) == REDISMODULE_OK) {
        double score = 0;
        RedisModuleString *member = RedisModule_ZsetRangeCurrentElement(key, &score);
        if (member != NULL) RedisModule_FreeString(ctx, member);
        RedisModule_ZsetRangeStop(key);
    }
    reply_five(ctx, denied);
    RedisModule_CloseKey(key);
    return REDISMODULE_OK;
}

int RedisModule_OnLoad(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    (void)argv;
    (void)argc;
    if (RedisModule_Init(ctx, "floor", 1, REDISMODULE_APIVER_1) == REDISMODULE_ERR)
        return REDISMODULE_ERR;
    RedisModule_SetModuleOptions(ctx, REDISMODULE_OPTION_NO_IMPLICIT_SIGNAL_MODIFIED);
    pxat = RedisModule_CreateString(NULL, "PXAT", 4);
    if (RedisModule_CreateCommand(ctx, "floor.admit", floor_admit, "write fast", 1, 1, 1) ==
            REDISMODULE_ERR ||
        RedisModule_CreateCommand(ctx, "floor.deny", floor_deny, "write fast", 1, 1, 1) ==
            REDISMODULE_ERR ||
        RedisModule_CreateCommand(ctx, "floor.logdeny", floor_log_deny, "write fast", 1, 1, 1) ==
            REDISMODULE_ERR)
        return REDISMODULE_ERR;
    return REDISMODULE_OK;
}
