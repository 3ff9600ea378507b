-- Whether calls are attached beside a lock (its hash of attached calls exists), asked in
-- the transaction that stores its holder's result and releases it, so the holder's run
-- looks for them at its end only when there are some.
-- KEYS[1] the lock's attached calls  ARGV (none of its own: ride_scripts adds the lock's
-- and the pipeline's databases, selected around it)
-- returns 1 some, 0 none
return redis.call('EXISTS', KEYS[1])
