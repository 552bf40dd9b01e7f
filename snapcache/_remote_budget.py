"""The remote tier's budget, kept by snapcache in Redis itself: which values a put evicts.

Under a namespace prefix P the tier keeps, beside its values:

    P:#lru                 a sorted set: value key -> eviction rank (priority, then time of last use)
    P:#sizes               a hash: value key -> its bytes
    P:#bytes               the sum of those sizes
    P:#catalog:<fp>:<scope> a hash: value key -> "token_count prefix_hash rolling_hash" of each
                           snapshot or record (not blocks), for longest-prefix lookups
    P:#catalog-of          a hash: value key -> the key of its catalog, so that evicting drops its row

A put runs one Lua script that decides and applies everything atomically on the server: it refuses
a value larger than the budget, or one that would need evicting a value of higher priority (the
same admission rule as the local tiers, `tier.may_evict`); otherwise it evicts the lowest-ranked
values until the new one fits, stores it, and updates the records. Every writer of every
machine goes through the same script, so the budget holds however many of them share the Redis.

Why not Redis's own `maxmemory` with an eviction policy: that budget is the whole server's (one
Redis serves several models and teams, each prefix with its own budget here), it evicts the
bookkeeping as readily as the values, it knows nothing of priorities, and managed Redis services
often refuse CONFIG SET. A server that also sets `maxmemory` still works: a value Redis evicted on
its own is a miss, and the lookup that finds it gone drops it from the records (`FORGET`).

The rank is one exact float: (priority + MAX_PRIORITY) * 2**32 + the second of last use, below
2**53 for every allowed priority, so that the lowest rank is the lowest priority, then the least
recently used (to the second; ties go in key order). Scripts touch keys they find in the records,
which Redis Cluster does not allow: the tier needs a standalone Redis or Valkey (or a replica set).
"""

from __future__ import annotations

from dataclasses import dataclass

from snapcache.key import MAX_PRIORITY

_RANK_SPAN = 1 << 32


@dataclass(frozen=True, slots=True)
class BudgetKeys:
    """The three bookkeeping keys of one namespace prefix."""

    lru: str
    sizes: str
    total: str
    catalog_of: str

    @classmethod
    def of(cls, prefix: str) -> BudgetKeys:
        return cls(f"{prefix}:#lru", f"{prefix}:#sizes", f"{prefix}:#bytes", f"{prefix}:#catalog-of")

    def with_value(self, name: str) -> list[str]:
        """The KEYS of FORGET and TOUCH for the value under `name`."""
        return [self.lru, self.sizes, self.total, self.catalog_of, name]


def rank(priority: int, now: float) -> str:
    """The eviction rank of a value of `priority` last used at `now`, as the script reads it."""
    return str((priority + MAX_PRIORITY) * _RANK_SPAN + (int(now) % _RANK_SPAN))


# Drops one value and every record of it; `catalog_of` maps a value key to its catalog's key.
_DROP = """
local function drop(lru, sizes, total, catalog_of, member)
  redis.call('DEL', member)
  redis.call('ZREM', lru, member)
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

# KEYS: lru, sizes, total, catalog_of, value key, its catalog. ARGV: value, rank, budget, catalog row
# ("" for a block, which is found by its key alone). Returns {1 if stored else 0, values evicted}.
PUT = (
    _DROP
    + f"""
local lru, sizes, total, catalog_of, key, catalog = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local value, rank, budget, row = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), ARGV[4]
local span = {_RANK_SPAN}
local size = string.len(value)
if size > budget then return {{0, 0}} end
local priority = math.floor(rank / span)
local old = tonumber(redis.call('HGET', sizes, key) or '0')
local used = tonumber(redis.call('GET', total) or '0') - old
local victims, freed, start = {{}}, 0, 0
while used - freed + size > budget do
  local batch = redis.call('ZRANGE', lru, start, start + 63, 'WITHSCORES')
  if #batch == 0 then
    -- the total says more than the records hold (a script cut short): count again
    local real = 0
    for _, bytes in ipairs(redis.call('HVALS', sizes)) do real = real + tonumber(bytes) end
    used = real - old
    if used - freed + size > budget then return {{0, 0}} end
    break
  end
  for i = 1, #batch, 2 do
    local member = batch[i]
    if member ~= key then
      if math.floor(tonumber(batch[i + 1]) / span) > priority then return {{0, 0}} end
      victims[#victims + 1] = member
      freed = freed + tonumber(redis.call('HGET', sizes, member) or '0')
      if used - freed + size <= budget then break end
    end
  end
  start = start + 64
end
for _, member in ipairs(victims) do drop(lru, sizes, total, catalog_of, member) end
redis.call('SET', key, value)
redis.call('ZADD', lru, ARGV[2], key)
redis.call('HSET', sizes, key, size)
redis.call('SET', total, string.format('%.0f', math.max(used - freed, 0) + size))
if row ~= '' then
  redis.call('HSET', catalog, key, row)
  redis.call('HSET', catalog_of, key, catalog)
end
return {{1, #victims}}
"""
)

# KEYS: lru, sizes, total, catalog_of, value key. Returns 1 if the value or its records were there.
FORGET = (
    _DROP
    + """
local found = redis.call('EXISTS', KEYS[5])
if drop(KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]) then found = 1 end
return found
"""
)

# KEYS: lru, sizes, total, catalog_of, value key. ARGV: now (seconds). Run right after a GET of the
# value: records its use, or drops the records of a value that is gone (evicted by Redis itself, or
# deleted by hand).
TOUCH = (
    _DROP
    + f"""
local key, span = KEYS[5], {_RANK_SPAN}
if redis.call('EXISTS', key) == 1 then
  local rank = redis.call('ZSCORE', KEYS[1], key)
  if rank then
    local priority = math.floor(tonumber(rank) / span)
    local now = tonumber(ARGV[1]) % span
    redis.call('ZADD', KEYS[1], 'XX', string.format('%.0f', priority * span + now), key)
  end
  return 1
end
drop(KEYS[1], KEYS[2], KEYS[3], KEYS[4], key)
return 0
"""
)


def rank_priority(value: float) -> int:
    """The priority a rank read back from the sorted set encodes."""
    return int(value // _RANK_SPAN) - MAX_PRIORITY
