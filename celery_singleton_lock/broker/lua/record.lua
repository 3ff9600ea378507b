-- Record a received message as unacked, as kombu's Redis QoS.append does, with its
-- in-transit note cleared in the same step (broker.transit's clear).
--
-- kombu sends a transaction for this (MULTI, ZADD, HSET, EXEC: four commands and four
-- replies); one script is one command and one reply, and still one step: there is no
-- moment where the message is neither noted in transit nor kombu's to restore.
--
-- KEYS[1..5] the notes' (absent when the message was not noted: 2 keys in all)
-- KEYS[#KEYS - 1] kombu's unacked index (a sorted set of delivery tags by time received)
-- KEYS[#KEYS] kombu's unacked hash (delivery tag -> [message, exchange, routing key])
-- ARGV[1] the delivery tag   ARGV[2] its score in the index, as kombu gives it
-- ARGV[3] its value in the hash, as kombu encodes it   ARGV[4] the note's member
-- returns 1 (recorded; the note cleared, if there was one)
--- @include "clear"
if #KEYS == 7 then
  clear(ARGV[4])
end
redis.call('ZADD', KEYS[#KEYS - 1], ARGV[2], ARGV[1])
redis.call('HSET', KEYS[#KEYS], ARGV[1], ARGV[3])
return 1
