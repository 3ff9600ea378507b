-- Store a task's result as Celery's Redis result backend does (the value, then a PUBLISH
-- of it on the key's channel), unless a success is stored under the key already.
--
-- Celery reads the stored result before every write and leaves a success as it is, so a
-- lost worker's copy of a task that ran again cannot overwrite it
-- (KeyValueStoreBackend._store_result). Here that read is the write's own first step:
-- the same answer, a round trip fewer, and nothing can land between the read and the write.
-- A stored value this cannot read as Celery's JSON (another serializer, compressed,
-- larger than ARGV[3]) is left for Celery's own code to read: nothing is written then.
--
-- KEYS[1] the result's key (celery-task-meta-<task id>, with any global key prefix)
-- ARGV[1] the result as Celery encoded it
-- ARGV[2] seconds the result is kept (0: for ever, as with result_expires=None)
-- ARGV[3] the largest stored value read here, in bytes (a larger one is Celery's to read)
-- returns 1 stored and published, 0 left as it was (a success was stored),
-- -1 nothing written: the stored value is not one this reads
local stored = redis.call('GET', KEYS[1])
if stored then
  if string.len(stored) > tonumber(ARGV[3]) then
    return -1
  end
  local decoded, meta = pcall(cjson.decode, stored)
  if not decoded or type(meta) ~= 'table' or type(meta['status']) ~= 'string' then
    return -1
  end
  if meta['status'] == 'SUCCESS' then
    return 0
  end
end
local ttl = tonumber(ARGV[2])
if ttl > 0 then
  redis.call('SETEX', KEYS[1], ttl, ARGV[1])
else
  redis.call('SET', KEYS[1], ARGV[1])
end
redis.call('PUBLISH', KEYS[1], ARGV[1])
return 1
