module redis-rate-limiter/ratelimit

go 1.19
