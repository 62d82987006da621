/* A module with an ACL category named `ratelimit` of its own, holding one command of its own
 * (`foreign.setvalue`): what a server that already has such a category looks like to the rate
 * limiter module when it loads after it. tests/acl.rs builds it against the redismodule.h of
 * the redis-module crate and loads it first. */

#include "redismodule.h"

static int setvalue(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    REDISMODULE_NOT_USED(argv);
    REDISMODULE_NOT_USED(argc);
    return RedisModule_ReplyWithSimpleString(ctx, "OK");
}

int RedisModule_OnLoad(RedisModuleCtx *ctx, RedisModuleString **argv, int argc) {
    REDISMODULE_NOT_USED(argv);
    REDISMODULE_NOT_USED(argc);
    if (RedisModule_Init(ctx, "foreign", 1, REDISMODULE_APIVER_1) == REDISMODULE_ERR) {
        return REDISMODULE_ERR;
    }
    if (RedisModule_AddACLCategory(ctx, "ratelimit") == REDISMODULE_ERR) {
        return REDISMODULE_ERR;
    }
    if (RedisModule_CreateCommand(ctx, "foreign.setvalue", setvalue, "write", 0, 0, 0) ==
        REDISMODULE_ERR) {
        return REDISMODULE_ERR;
    }
    RedisModuleCommand *command = RedisModule_GetCommand(ctx, "foreign.setvalue");
    if (command == NULL ||
        RedisModule_SetCommandACLCategories(command, "write ratelimit") == REDISMODULE_ERR) {
        return REDISMODULE_ERR;
    }
    return REDISMODULE_OK;
}
