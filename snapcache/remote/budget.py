"""The remote tier's budget, kept by snapcache in Redis itself: which values a put evicts.

Under a namespace prefix P the tier keeps, beside its values:

    P:#levels               a sorted set of the priorities values have (member and score alike)
    P:#lru:<priority>       per priority, a sorted set: value key -> time of last use (ms)
    P:#priority             a hash: value key -> its priority
    P:#sizes                a hash: value key -> its bytes
    P:#bytes                the sum of those sizes
    P:#catalog:<fp>:<scope> a hash: value key -> "token_count prefix_hash rolling_hash" of each
                            snapshot or record (not blocks), for longest-prefix lookups
    P:#catalog-of           a hash: value key -> the key of its catalog, so that evicting drops its row

A put runs one Lua script that decides and applies everything atomically on the server: it refuses
a value larger than the budget, or one that would need evicting a value of higher priority (the
same admission rule as the local tiers, `tier.may_evict`); otherwise it evicts values of the lowest
priority, least recently used first, until the new one fits, stores it, and updates the records.
Every writer of every machine goes through the same script, so the budget holds however many of
them share the Redis.

Why not Redis's own `maxmemory` with an eviction policy: that budget is the whole server's (one
Redis serves several models and teams, each prefix with its own budget here), it evicts the
bookkeeping as readily as the values, it knows nothing of priorities, and managed Redis services
often refuse CONFIG SET. A server that also sets `maxmemory` still works: a value Redis evicted on
its own is a miss, and the lookup that finds it gone drops it from the records (`TOUCH`).

Scripts touch keys they find in the records, which Redis Cluster does not allow: the tier needs a
standalone Redis or Valkey (replicated or not).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class BudgetKeys:
    """The bookkeeping keys of one namespace prefix (the per-priority sets share `lru_prefix`)."""

    levels: str
    lru_prefix: str
    priority: str
    sizes: str
    total: str
    catalog_of: str

    @classmethod
    def of(cls, prefix: str) -> BudgetKeys:
        return cls(
            f"{prefix}:#levels",
            f"{prefix}:#lru:",
            f"{prefix}:#priority",
            f"{prefix}:#sizes",
            f"{prefix}:#bytes",
            f"{prefix}:#catalog-of",
        )

    def with_value(self, name: str) -> list[str]:
        """The KEYS of every script, for the value under `name` (PUT adds its catalog)."""
        return [self.levels, self.lru_prefix, self.priority, self.sizes, self.total, self.catalog_of, name]


def now_ms(now: float) -> str:
    """A time of use as the scripts record it."""
    return str(int(now * 1000))


# The first lines of every script: the namespace's keys, and how one value and its records go.
_COMMON = """
local levels, lru, prio, sizes = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local total, catalog_of, key = KEYS[5], KEYS[6], KEYS[7]

local function unlist(member)
  local level = redis.call('HGET', prio, member)
  if level then
    redis.call('ZREM', lru .. level, member)
    if redis.call('ZCARD', lru .. level) == 0 then redis.call('ZREM', levels, level) end
    redis.call('HDEL', prio, member)
  end
end

local function drop(member)
  redis.call('DEL', member)
  unlist(member)
  local size = redis.call('HGET', sizes, member)
  if size then
    redis.call('HDEL', sizes, member)
    local left = tonumber(redis.call('GET', total) or '0') - tonumber(size)
    redis.call('SET', total, string.format('%.0f', math.max(left, 0)))
  end
  local catalog = redis.call('HGET', catalog_of, member)
  if catalog then
    redis.call('HDEL', catalog, member)
    redis.call('HDEL', catalog_of, member)
  end
  return size
end
"""

# KEYS: with_value(value key) + its catalog. ARGV: value, priority, now (ms), budget, catalog row
# ("" for a block, which is found by its key alone). Returns {1 if stored else 0, values evicted}.
PUT = (
    _COMMON
    + """
local catalog = KEYS[8]
local value, priority, now, budget, row = ARGV[1], tonumber(ARGV[2]), ARGV[3], tonumber(ARGV[4]), ARGV[5]
local size = string.len(value)
if size > budget then return {0, 0} end
local old = tonumber(redis.call('HGET', sizes, key) or '0')
local used = tonumber(redis.call('GET', total) or '0') - old
local victims, freed = {}, 0
if used + size > budget then
  for _, level in ipairs(redis.call('ZRANGE', levels, 0, -1)) do
    if tonumber(level) > priority then break end
    local start = 0
    while used - freed + size > budget do
      local batch = redis.call('ZRANGE', lru .. level, start, start + 63)
      if #batch == 0 then break end
      for _, member in ipairs(batch) do
        if member ~= key then
          victims[#victims + 1] = member
          freed = freed + tonumber(redis.call('HGET', sizes, member) or '0')
          if used - freed + size <= budget then break end
        end
      end
      start = start + 64
    end
    if used - freed + size <= budget then break end
  end
  if used - freed + size > budget then
    -- higher priorities in the way, or a total that says more than the records hold: count again
    local real = 0
    for _, bytes in ipairs(redis.call('HVALS', sizes)) do real = real + tonumber(bytes) end
    if real - old - freed + size > budget then return {0, 0} end
    used = real - old
  end
end
for _, member in ipairs(victims) do drop(member) end
unlist(key)
redis.call('SET', key, value)
redis.call('ZADD', lru .. ARGV[2], now, key)
redis.call('ZADD', levels, ARGV[2], ARGV[2])
redis.call('HSET', prio, key, ARGV[2])
redis.call('HSET', sizes, key, size)
redis.call('SET', total, string.format('%.0f', math.max(used - freed, 0) + size))
if row ~= '' then
  redis.call('HSET', catalog, key, row)
  redis.call('HSET', catalog_of, key, catalog)
end
return {1, #victims}
"""
)

# KEYS: with_value(value key). Returns 1 if the value or its records were there.
FORGET = (
    _COMMON
    + """
local found = redis.call('EXISTS', key)
if drop(key) then found = 1 end
return found
"""
)

# KEYS: with_value(value key). ARGV: now (ms). Run right after a GET of the value: records its use,
# or drops the records of a value that is gone (evicted by Redis itself, or deleted by hand).
TOUCH = (
    _COMMON
    + """
if redis.call('EXISTS', key) == 1 then
  local level = redis.call('HGET', prio, key)
  if level then redis.call('ZADD', lru .. level, 'XX', ARGV[1], key) end
  return 1
end
drop(key)
return 0
"""
)
