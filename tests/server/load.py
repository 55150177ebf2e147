"""Bounded load test on loopback: N concurrent clients for a fixed time. Passes when every answer
is either a complete reply or the designed 503 (with Retry-After), and the server's memory
returns to its idle level afterwards."""

import argparse
import asyncio
import json
import random
import time

import httpx


def metric(text, name):
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def client_loop(c, model, stop_at, stats, rng):
    while time.monotonic() < stop_at:
        stream = rng.random() < 0.5
        n = rng.randint(8, 64)
        body = {"model": model, "messages": [{"role": "user", "content": f"load {rng.random()}"}],
                "max_tokens": n, "temperature": 0.8, "stream": stream,
                "chat_template_kwargs": {"enable_thinking": False}}
        t0 = time.monotonic()
        try:
            if stream:
                async with c.stream("POST", "/v1/chat/completions", json=body) as r:
                    if r.status_code == 503:
                        stats["503"] += 1
                        stats["retry_after_missing"] += "retry-after" not in r.headers
                        await r.aread()
                        await asyncio.sleep(float(r.headers.get("retry-after", "1")) * rng.random())
                        continue
                    if r.status_code != 200:
                        stats["errors"].append(f"status {r.status_code}")
                        continue
                    done, finish, tokens = False, None, 0
                    async for line in r.aiter_lines():
                        if line == "data: [DONE]":
                            done = True
                        elif line.startswith("data: "):
                            j = json.loads(line[6:])
                            if "error" in j:
                                stats["errors"].append(j["error"]["message"])
                            elif j["choices"] and j["choices"][0]["finish_reason"]:
                                finish = j["choices"][0]["finish_reason"]
                    if not done or finish not in ("stop", "length"):
                        stats["errors"].append(f"incomplete stream (done={done}, finish={finish})")
                        continue
            else:
                r = await c.post("/v1/chat/completions", json=body)
                if r.status_code == 503:
                    stats["503"] += 1
                    stats["retry_after_missing"] += "retry-after" not in r.headers
                    await asyncio.sleep(float(r.headers.get("retry-after", "1")) * rng.random())
                    continue
                if r.status_code != 200:
                    stats["errors"].append(f"status {r.status_code}: {r.text[:200]}")
                    continue
                j = r.json()
                u = j["usage"]["completion_tokens"]
                if j["choices"][0]["finish_reason"] not in ("stop", "length") or u > n:
                    stats["errors"].append(f"bad reply {j}")
                    continue
                stats["tokens"] += u
            stats["ok"] += 1
            stats["latency"].append(time.monotonic() - t0)
        except Exception as e:  # noqa: BLE001 - every failure is counted and reported
            stats["errors"].append(repr(e))


async def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("base")
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--seconds", type=float, default=30)
    a = ap.parse_args()
    limits = httpx.Limits(max_connections=a.clients + 4)
    async with httpx.AsyncClient(base_url=a.base, timeout=120, limits=limits) as c:
        model = (await c.get("/v1/models")).json()["data"][0]["id"]
        # Warm up, then take the idle memory level.
        await c.post("/v1/chat/completions", json={"model": model, "max_tokens": 4,
                     "messages": [{"role": "user", "content": "warm"}]})
        idle = metric((await c.get("/metrics")).text, "niwaki_process_resident_bytes")
        # Slots that keep their last conversation may each hold up to a whole sequence after.
        p = (await c.get("/v1/policy")).json()
        kept_max = 0
        if p["conversation_cache"]["value"] == "on":
            kept_max = p["slots"]["value"] * (p["sequence_state_bytes_max"]["value"]
                                              + 2 * p["sequence_checkpoint_bytes"]["value"])
        stats = {"ok": 0, "503": 0, "errors": [], "latency": [], "tokens": 0, "retry_after_missing": 0}
        rng = random.Random(7)
        t0 = time.monotonic()
        stop_at = t0 + a.seconds
        peak = idle

        async def sample_memory():
            nonlocal peak
            while time.monotonic() < stop_at:
                peak = max(peak, metric((await c.get("/metrics")).text, "niwaki_process_resident_bytes"))
                await asyncio.sleep(0.5)
        await asyncio.gather(sample_memory(), *[
            client_loop(c, model, stop_at, stats, random.Random(rng.random())) for _ in range(a.clients)])
        elapsed = time.monotonic() - t0
        # Let the server settle, then compare memory with the idle level.
        in_flight = 1.0
        for _ in range(100):
            m = (await c.get("/metrics")).text
            in_flight = metric(m, "niwaki_requests_in_flight")
            if in_flight == 0:
                break
            await asyncio.sleep(0.1)
        after = metric((await c.get("/metrics")).text, "niwaki_process_resident_bytes")
        state = metric((await c.get("/metrics")).text, "niwaki_sequence_state_bytes")
        health = (await c.get("/health")).status_code
    lat = sorted(stats["latency"]) or [0]
    mib = 1 << 20
    print(f"load: {a.clients} clients, {elapsed:.1f} s: {stats['ok']} complete replies "
          f"({stats['ok'] / elapsed:.1f}/s), {stats['503']} designed 503s, {len(stats['errors'])} errors; "
          f"latency p50 {lat[len(lat) // 2]:.3f} s, p99 {lat[int(len(lat) * 0.99)]:.3f} s; "
          f"memory idle {idle / mib:.1f} MiB, peak {peak / mib:.1f} MiB, after {after / mib:.1f} MiB; "
          f"sequence state after {state:.0f} B (kept conversations: at most {kept_max} B)")
    for e in stats["errors"][:10]:
        print("  error:", e)
    failures = []
    if stats["errors"]:
        failures.append("errors other than 503")
    if stats["retry_after_missing"]:
        failures.append("503 without Retry-After")
    if stats["ok"] == 0:
        failures.append("no complete replies")
    if in_flight != 0 or state > kept_max:
        failures.append("requests or sequence state left over")
    # Allocator caches may keep a little; more than 64 MiB over idle is a leak for a tiny model.
    if after > idle + 64 * mib:
        failures.append("memory did not return to its idle level")
    if health != 200:
        failures.append("server unhealthy afterwards")
    for f in failures:
        print("FAIL:", f)
    print(f"{6 - len(failures)} passed, {len(failures)} failed")
    raise SystemExit(1 if failures else 0)


if __name__ == "__main__":
    asyncio.run(main())
