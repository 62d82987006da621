// A token bucket of 10 refilling at 5 per second, from Go with redigo.
//
// Uses RL.TOKENBUCKET when the module is loaded, else the Lua twin
// (lua-reference/token_bucket.lua) through EVALSHA: both decide alike on the same key. With
// go-redis the call is one line: rdb.Do(ctx, "RL.TOKENBUCKET", key, 10, 5).Int64Slice().
//
//	REDIS_URL=redis://127.0.0.1:6379 go run seed.go
package main

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"time"

	"github.com/gomodule/redigo/redis"
)

func main() {
	url := os.Getenv("REDIS_URL")
	if url == "" {
		url = "redis://127.0.0.1:6379"
	}
	c, err := redis.DialURL(url)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	defer c.Close()
	key := "example:go"
	if _, err := c.Do("DEL", key); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}

	// COMMAND INFO answers [nil] for a command the server does not have.
	info, err := redis.Values(c.Do("COMMAND", "INFO", "RL.TOKENBUCKET"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	hasModule := len(info) == 1 && info[0] != nil
	var twin *redis.Script
	if !hasModule {
		_, here, _, _ := runtime.Caller(0)
		path := filepath.Join(filepath.Dir(here), "..", "..", "lua-reference", "token_bucket.lua")
		src, err := os.ReadFile(path)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		twin = redis.NewScript(1, string(src))
	}

	// [allowed, remaining, retry_after_ms, reset_after_ms, limit]
	take := func() []int64 {
		var reply []int64
		var err error
		if hasModule {
			reply, err = redis.Int64s(c.Do("RL.TOKENBUCKET", key, 10, 5))
		} else {
			reply, err = redis.Int64s(twin.Do(c, key, 10, 5))
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		return reply
	}

	if hasModule {
		fmt.Println("path: module")
	} else {
		fmt.Println("path: lua")
	}
	allowed, retry := 0, int64(-1)
	for i := 0; i < 12; i++ {
		r := take()
		if r[0] == 1 {
			allowed++
		} else if retry < 0 {
			retry = r[2]
		}
	}
	fmt.Printf("burst: %d of 12 allowed\n", allowed)
	if retry > 100 && retry <= 200 {
		fmt.Println("first denial: retry in about 200 ms")
	} else {
		fmt.Printf("first denial: retry in %d ms\n", retry)
	}
	time.Sleep(time.Second)
	allowed = 0
	for i := 0; i < 8; i++ {
		allowed += int(take()[0])
	}
	fmt.Printf("after 1 s: %d of 8 allowed\n", allowed)
}
