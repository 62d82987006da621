// `await using` as the runtime itself runs it (no TypeScript in between): only imported where the
// syntax exists (tests/native.test.mjs checks first).
export async function holdTwo(client, key, limit, during) {
  {
    await using first = (await client.acquire(key, limit)).lease;
    await using second = (await client.acquire(key, limit)).lease;
    await during(first, second);
  }
}
