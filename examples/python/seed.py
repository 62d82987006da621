"""A token bucket of 10 refilling at 5 per second, from Python with redis-py.

Uses RL.TOKENBUCKET when the module is loaded, else the Lua twin (lua-reference/token_bucket.lua)
through EVALSHA: both decide alike on the same key.

    REDIS_URL=redis://127.0.0.1:6379 python3 seed.py
"""

import os
import pathlib
import time

import redis

r = redis.Redis.from_url(os.environ.get("REDIS_URL", "redis://127.0.0.1:6379"))
key = "example:python"
r.delete(key)


def has_command(name):
    """COMMAND INFO answers [nil] for a command the server does not have (read raw: redis-py's
    parser of COMMAND replies expects every command to exist)."""
    conn = r.connection_pool.get_connection()
    try:
        conn.send_command("COMMAND", "INFO", name)
        return conn.read_response()[0] is not None
    finally:
        r.connection_pool.release(conn)


has_module = has_command("RL.TOKENBUCKET")
script_path = pathlib.Path(__file__).resolve().parents[2] / "lua-reference" / "token_bucket.lua"
twin = None if has_module else r.register_script(script_path.read_text())


def take():
    """[allowed, remaining, retry_after_ms, reset_after_ms, limit]"""
    if has_module:
        return r.execute_command("RL.TOKENBUCKET", key, 10, 5)
    return twin(keys=[key], args=[10, 5])


print("path:", "module" if has_module else "lua")
replies = [take() for _ in range(12)]
print(f"burst: {sum(x[0] for x in replies)} of 12 allowed")
retry = next(x[2] for x in replies if x[0] == 0)
print("first denial: retry in about 200 ms" if 100 < retry <= 200 else f"first denial: retry in {retry} ms")
time.sleep(1)
print(f"after 1 s: {sum(take()[0] for _ in range(8))} of 8 allowed")
