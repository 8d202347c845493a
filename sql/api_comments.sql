-- The reference text of every public function, kept beside the catalog so that `\df+ pgjobs.*` and
-- docs/sql-api.md (rendered from pg_proc and these comments by `python -m pgjobs.ops.sqldoc`) say the
-- same thing. Each comment says what the function does, then an "Errors:" line (SQLSTATE class PJ, see
-- pgjobs/errors.py) and a "Roles:" line that tests/ops/test_sqldoc.py checks against sql/roles.sql.
-- The migrator runs this file after every function file and after routines the files no longer define
-- are dropped, so a name here is never ambiguous; names without argument lists keep a comment valid
-- when a function gains a parameter. A new public function gets its comment here: the test lists the
-- ones that lack one.

-- Producing work

COMMENT ON FUNCTION pgjobs.enqueue IS $$Inserts one job and returns its id, whether this call created it, and its state.
With a unique_key, a second enqueue of the same (kind, unique_key) returns the existing job with created = false, also when two callers race; unique_live_only makes the key block only while its holder is not terminal. rate_key names the rate limit the job's starts draw tokens from (configure_rate_limit; a key without a limit is unlimited). Joins the caller's transaction: the job exists only if it commits. A job due now sends pgjobs_wake.
Errors: PJ001 the queue is at its max_length; PJ002 an invalid argument (empty kind or queue, NULL payload, max_attempts < 1, a value beyond the limits).
Roles: pgjobs_producer, pgjobs_admin.$$;

COMMENT ON FUNCTION pgjobs.enqueue_many IS $$Inserts a JSON array of job specs (the enqueue arguments as keys, rate_key included, plus ref and depends_on), all or nothing, in one statement; returns one row per spec.
depends_on: [{"ref" | "job" | "batch": ..., "on": "success" | "failure" | "complete"}] puts a job in waiting until its parents settle. as_batch makes the set one batch with counters and a state of its own.
Errors: PJ001 a bounded queue is full; PJ002 a malformed spec or dependency (the message names the spec and the value); PJ005 an invalid graph (cycle, unknown ref, missing parent, duplicate edge).
Roles: pgjobs_producer, pgjobs_admin.$$;

COMMENT ON FUNCTION pgjobs.enqueue_arrays IS $$The bulk load as columns: job i is kinds[i] with the i-th element of the JSON array payloads in queues[i], everything else at its default (pending now). payloads NULL means {} for every job, queues NULL means 'default'. Returns the ids in the arrays' order.
enqueue_many's contract for such jobs: all or nothing, status events, one pgjobs_wake per queue.
Errors: PJ001 a bounded queue is full; PJ002 arrays of different lengths or a bad element (named as jobs[i]).
Roles: pgjobs_producer, pgjobs_admin.$$;

COMMENT ON FUNCTION pgjobs.enqueue_staged IS $$enqueue_many of the specs a client COPYed into staging, a temporary table of the calling session with columns n bigint, kind text, queue text, payload jsonb, meta jsonb, run_at text, priority bigint, max_attempts bigint, unique_key text, unique_live_only boolean, group_key text, ref text, depends_on jsonb.
Errors: PJ002 staging is not such a table (another session's, a view, a table with triggers, rules or row security) or a staged spec is invalid; otherwise as enqueue_many (PJ001, PJ005).
Roles: pgjobs_producer, pgjobs_admin.$$;

COMMENT ON FUNCTION pgjobs.job_status IS $$One job: its row plus depends_on, its incoming edges ([{"job": 12, "on": "success"}, {"batch": 3, "on": "complete"}]). No row for an unknown id.
Errors: none.
Roles: pgjobs_producer, pgjobs_reader, pgjobs_admin.$$;

COMMENT ON FUNCTION pgjobs.batch_status IS $$A batch's counters and state: total, pending (not yet terminal), succeeded, failed, cancelled, fraction_settled, created_at, started_at (first claim), completed_at. No row for an unknown id.
Errors: none.
Roles: pgjobs_producer, pgjobs_reader, pgjobs_admin.$$;

COMMENT ON FUNCTION pgjobs.status_snapshot IS $$The current state of the jobs in job_ids plus the members of batch in_batch (only the live ones when live_only): where a status subscriber starts, and what it re-reads for jobs the event log does not hold.
Errors: none.
Roles: pgjobs_producer, pgjobs_reader, pgjobs_admin.$$;

-- Doing work

COMMENT ON FUNCTION pgjobs.claim IS $$Leases up to max_jobs due jobs of the queues to worker for lease: pending and due scheduled jobs, and active jobs whose lease expired (attempt + 1, checkpoint kept), by priority, run_at, id, with FOR UPDATE SKIP LOCKED. Honours kind_limits ({"kind": n}: only those kinds, at most n each), paused queues, max_active, max_active_per_group and fair selection.
Call it in a short READ COMMITTED transaction (a capped claim in REPEATABLE READ or SERIALIZABLE is refused).
Errors: PJ002 an invalid argument (empty worker, lease <= 0, max_jobs outside 1 to 10,000, malformed kind_limits, a capped claim in a snapshot isolation level).
Roles: pgjobs_worker, pgjobs_admin.$$;

COMMENT ON FUNCTION pgjobs.renew_lease IS $$Extends the lease of a job this lease_token holds; false (nothing changed) when the token no longer holds it.
Errors: PJ002 a lease <= 0 or beyond the limits.
Roles: pgjobs_worker, pgjobs_admin.$$;

COMMENT ON FUNCTION pgjobs.renew_leases IS $$Extends the leases of many jobs in one call; returns the jobs still held, each with cancel_requested and renewed. It never waits for a row lock: a job busy in another transaction comes back with renewed = false (kept, not renewed this time); a job left out is no longer held.
Errors: PJ002 arrays of different lengths, or a lease <= 0 or beyond the limits.
Roles: pgjobs_worker, pgjobs_admin.$$;

COMMENT ON FUNCTION pgjobs.checkpoint IS $$Saves checkpoint on the job for its next attempt; false when the lease token no longer holds it.
Errors: none.
Roles: pgjobs_worker, pgjobs_admin.$$;

COMMENT ON FUNCTION pgjobs.progress IS $$Records progress on the job and logs it to the status stream; false when the lease token no longer holds it.
Errors: none.
Roles: pgjobs_worker, pgjobs_admin.$$;

COMMENT ON FUNCTION pgjobs.complete IS $$Ends the attempt as succeeded with result, and inserts continuations (job specs as in enqueue_many) atomically with it; releases or cancels the job's dependants. false when the lease token no longer holds the job. A job whose cancellation was requested ends cancelled instead (result kept, continuations not added).
Errors: PJ002 or PJ005 a malformed continuation.
Roles: pgjobs_worker, pgjobs_admin.$$;

COMMENT ON FUNCTION pgjobs.complete_many IS $$complete for many jobs in one round trip (the worker's hot path), locking them in id order; results[i] is job i's result (NULL: none). Returns how many it completed; pairs whose token no longer holds the job are skipped.
Errors: PJ002 arrays of different lengths or beyond the limits.
Roles: pgjobs_worker, pgjobs_admin.$$;

COMMENT ON FUNCTION pgjobs.fail IS $$Ends the attempt as failed with error. With attempts left the job goes back to scheduled at retry_at, or after retry_backoff(attempt); pending when retry_at is now or past; out of attempts it becomes failed. Returns the new state; NULL when the lease token no longer holds the job.
Errors: PJ002 a retry_at beyond the limits.
Roles: pgjobs_worker, pgjobs_admin.$$;

COMMENT ON FUNCTION pgjobs.dead_letter IS $$Ends the job as failed now with error, whatever attempts are left; false when the lease token no longer holds it.
Errors: none.
Roles: pgjobs_worker, pgjobs_admin.$$;

COMMENT ON FUNCTION pgjobs.release IS $$Gives the job back unfinished, claimable at once or at run_at, and refunds the attempt; false when the lease token no longer holds it.
Errors: PJ002 a run_at beyond the limits.
Roles: pgjobs_worker, pgjobs_admin.$$;

COMMENT ON FUNCTION pgjobs.ack_cancel IS $$Ends as cancelled a job whose cancellation was requested. Without a request it returns false and nothing changes, so a forged pgjobs_cancel notification ends nothing.
Errors: none.
Roles: pgjobs_worker, pgjobs_admin.$$;

COMMENT ON FUNCTION pgjobs.add_to_batch IS $$A running batch member adds a sibling job (a spec as in enqueue_many) to its batch; returns the new job's id. With before_continuations the jobs that depend on the caller also wait for the new sibling.
Errors: PJ002 a malformed spec; PJ004 the caller is not in a batch, or its cancellation was requested.
Roles: pgjobs_worker, pgjobs_admin.$$;

COMMENT ON FUNCTION pgjobs.parent_results IS $$The results of a job's parents as {"<parent job id>": result, ...}; a batch parent contributes every member.
Errors: none.
Roles: pgjobs_worker, pgjobs_admin.$$;

COMMENT ON FUNCTION pgjobs.parent_results_many IS $$parent_results for many jobs in one round trip: one row per job of ids that has parents.
Errors: none.
Roles: pgjobs_worker, pgjobs_admin.$$;

COMMENT ON FUNCTION pgjobs.retry_backoff IS $$The delay before the next attempt after a failed one: 1 s, 2 s, 4 s ... doubling with the attempt, +/-25 % jitter, capped at one hour.
Errors: none.
Roles: pgjobs_worker, pgjobs_admin.$$;

COMMENT ON FUNCTION pgjobs.next_due_at IS $$When the next job of these queues becomes due, overdue ones included (NULL: none scheduled or leased).
Errors: none.
Roles: pgjobs_worker, pgjobs_admin.$$;

COMMENT ON FUNCTION pgjobs.next_due_within IS $$When the next job of these queues becomes due within the coming interval (a run_at or a lease expiry; NULL: none): when an idle worker should look again.
Errors: PJ002 within is not positive or beyond the limits.
Roles: pgjobs_worker, pgjobs_admin.$$;

COMMENT ON FUNCTION pgjobs.worker_heartbeat IS $$Records that worker is alive, with its meta (host, pid, queues, concurrency, active, kinds, heartbeat_interval); returns the time recorded. Runs the maintenance pass when one is due.
Errors: PJ002 an empty or oversized worker name.
Roles: pgjobs_worker, pgjobs_admin.$$;

COMMENT ON FUNCTION pgjobs.reap_workers IS $$Forgets workers silent for stale_after and makes the jobs they held claimable at once; returns how many workers it forgot. Rows another transaction holds are skipped (that job is ending, renewed or claimed).
Errors: PJ002 a negative stale_after or one beyond the limits.
Roles: pgjobs_worker, pgjobs_admin.$$;

COMMENT ON FUNCTION pgjobs.deregister_worker IS $$A stopping worker leaves: its row goes and the jobs it still holds become claimable at once. Returns whether it was registered.
Errors: PJ002 an empty or oversized worker name.
Roles: pgjobs_worker, pgjobs_admin.$$;

COMMENT ON FUNCTION pgjobs.vacuum_due IS $$The pgjobs tables a VACUUM should visit now, when autovacuum will not (off, off for the table, or far behind). horizon passed back as vacuumed_under lists nothing while the same oldest snapshot still holds the dead row versions. VACUUM itself is the caller's: it cannot run inside a function.
Errors: none.
Roles: pgjobs_worker, pgjobs_admin.$$;

-- Recurring jobs (the scheduler's calls)

COMMENT ON FUNCTION pgjobs.upsert_schedule IS $$Creates or replaces a schedule; next_run_at is its first run, computed by the caller from cron in timezone. missed is 'once' (one catch-up run) or 'skip'. With keep_next_run_at an existing schedule whose cron and time zone are unchanged keeps its next_run_at. paused and the last run are kept on update.
Errors: PJ002 an invalid argument (a cron without the shape of a cron expression, an oversized name, time zone or time); PJ004 a dynamic upsert over a code-defined schedule.
Roles: pgjobs_worker, pgjobs_admin.$$;

COMMENT ON FUNCTION pgjobs.prune_code_schedules IS $$Deletes the code-defined schedules whose names are not in keep; dynamic schedules are never touched. Returns how many it deleted.
Errors: PJ002 keep beyond the limits.
Roles: pgjobs_worker, pgjobs_admin.$$;

COMMENT ON FUNCTION pgjobs.due_schedules IS $$Unpaused schedules with next_run_at <= now, earliest first, at most max_rows. With skip_locked it locks the rows it returns and skips those another scheduler holds, so racing schedulers split the due set.
Errors: PJ002 a max_rows beyond the limits.
Roles: pgjobs_worker, pgjobs_admin.$$;

COMMENT ON FUNCTION pgjobs.materialize_schedule IS $$Inserts the job of a schedule's run and moves the schedule to next_run_at, in one transaction, only if the schedule is still at expected_run_at: exactly once however many schedulers race. Returns the job id; NULL for a loser.
Errors: PJ002 an invalid name or time.
Roles: pgjobs_worker, pgjobs_admin.$$;

COMMENT ON FUNCTION pgjobs.materialize_schedules IS $$materialize_schedule for many runs in one call: schedule names[i], still at expected_run_ats[i], moves to next_run_ats[i], and its run's job is inserted unless skip_runs[i]. Rows another transaction holds are skipped. One row per schedule advanced: job_id NULL for a skipped run, created false when the run's job already existed, error for a run whose job could not be inserted.
Errors: PJ002 arrays of different lengths or an invalid name or time.
Roles: pgjobs_worker, pgjobs_admin.$$;

COMMENT ON FUNCTION pgjobs.next_schedule_at IS $$When the earliest unpaused schedule is due (NULL: none), leaving out except_names: how long a scheduler may sleep.
Errors: none.
Roles: pgjobs_worker, pgjobs_admin.$$;

COMMENT ON FUNCTION pgjobs.get_schedule IS $$One schedule by name; no row for an unknown name.
Errors: none.
Roles: pgjobs_reader, pgjobs_admin.$$;

COMMENT ON FUNCTION pgjobs.list_schedules IS $$Every schedule, code-defined and dynamic, by name.
Errors: none.
Roles: pgjobs_reader, pgjobs_admin.$$;

COMMENT ON FUNCTION pgjobs.pause_schedule IS $$Pauses a schedule; returns whether this call paused it (false: it was paused already).
Errors: PJ003 an unknown name.
Roles: pgjobs_admin.$$;

COMMENT ON FUNCTION pgjobs.resume_schedule IS $$Unpauses a schedule; returns whether this call resumed it. Without next_run_at the runs that came due while paused follow its missed-run policy; with it the schedule restarts there.
Errors: PJ002 an invalid next_run_at; PJ003 an unknown name.
Roles: pgjobs_admin.$$;

COMMENT ON FUNCTION pgjobs.remove_schedule IS $$Deletes a schedule (the jobs it already enqueued stay); returns true. A code-defined schedule needs force, as it comes back at the next worker start.
Errors: PJ003 an unknown name; PJ004 a code-defined schedule without force.
Roles: pgjobs_admin.$$;

COMMENT ON FUNCTION pgjobs.trigger_schedule IS $$Run now: enqueues one job of the schedule's kind, payload, queue, priority and attempts at once, without moving its next run; returns the job's id.
Errors: PJ003 an unknown name; otherwise as enqueue (PJ001).
Roles: pgjobs_admin.$$;

-- Reading state

COMMENT ON FUNCTION pgjobs.batch_graph IS $$A batch as {"batch": {...}, "nodes": [...], "edges": [...]}: its members with their states and the dependency edges between them. NULL for an unknown id.
Errors: none.
Roles: pgjobs_reader, pgjobs_admin.$$;

COMMENT ON FUNCTION pgjobs.stats IS $$How many jobs each queue holds in each state.
Errors: none.
Roles: pgjobs_reader, pgjobs_admin.$$;

COMMENT ON FUNCTION pgjobs.list_jobs IS $$A page of jobs, newest first, filtered by state, queue, kind and search (a case-insensitive substring of the kind, the unique key or the payload's text).
Errors: PJ002 a max_rows or skip_rows beyond the limits.
Roles: pgjobs_reader, pgjobs_admin.$$;

COMMENT ON FUNCTION pgjobs.count_jobs IS $$How many jobs list_jobs's filter matches.
Errors: none.
Roles: pgjobs_reader, pgjobs_admin.$$;

COMMENT ON FUNCTION pgjobs.list_workers IS $$Registered workers with their meta, how many jobs each holds, and status live or stale (silent for three of its own heartbeat intervals, or for stale_after when given).
Errors: PJ002 a stale_after that is not positive or beyond the limits.
Roles: pgjobs_reader, pgjobs_admin.$$;

COMMENT ON FUNCTION pgjobs.list_queues IS $$The settings of every configured queue.
Errors: none.
Roles: pgjobs_reader, pgjobs_admin.$$;

COMMENT ON FUNCTION pgjobs.read_events IS $$The status stream: every transition and progress report after the cursor after_id, in event_id order, at most max_rows matching events; job_ids and batch_id select jobs (either matches), queue narrows. Only committed events, also from long transactions; call it in autocommit. A cursor older than the log reads from the oldest retained event.
Errors: PJ002 an invalid cursor or max_rows.
Roles: pgjobs_reader, pgjobs_admin.$$;

COMMENT ON FUNCTION pgjobs.stream_bounds IS $$The oldest and newest retained event ids (NULL, NULL when the log is empty); a cursor below oldest_id has lost the events in between to retention.
Errors: none.
Roles: pgjobs_reader, pgjobs_admin.$$;

COMMENT ON FUNCTION pgjobs.stream_head IS $$The newest event id (NULL when the log is empty), read from one partition: what a follower asks on every read.
Errors: none.
Roles: pgjobs_reader, pgjobs_admin.$$;

COMMENT ON FUNCTION pgjobs.dashboard_jobs IS $$The dashboard's page of the job list, newest first, each row carrying the filter's full count (total_rows); no row when the page is past the end.
Errors: PJ002 a page beyond the limits.
Roles: pgjobs_reader, pgjobs_admin.$$;

COMMENT ON FUNCTION pgjobs.dashboard_count_jobs IS $$How many jobs the dashboard's job filter matches (search: a case-insensitive substring of the kind, the unique key or the payload's text).
Errors: PJ002 an oversized filter value.
Roles: pgjobs_reader, pgjobs_admin.$$;

COMMENT ON FUNCTION pgjobs.dashboard_queues IS $$Every queue with jobs or settings: counts per state, the age of its oldest claimable job in seconds, and its settings (settings_at NULL: never configured).
Errors: none.
Roles: pgjobs_reader, pgjobs_admin.$$;

COMMENT ON FUNCTION pgjobs.dashboard_state_counts IS $$How many jobs the dashboard's job filter (queue, kind, search) matches in each state: the counts on the job list's state tabs.
Errors: PJ002 a filter value beyond the limits.
Roles: pgjobs_reader, pgjobs_admin.$$;

COMMENT ON FUNCTION pgjobs.dashboard_groups IS $$A fair queue's groups with live work: pending, scheduled and active counts, and when the round-robin last served each, busiest first.
Errors: PJ002 an invalid queue name or max_rows.
Roles: pgjobs_reader, pgjobs_admin.$$;

COMMENT ON FUNCTION pgjobs.dashboard_throughput IS $$Jobs settled per minute (succeeded, failed, cancelled) over the last minutes minutes, zeros included, optionally for one queue.
Errors: PJ002 minutes outside its range or an invalid queue name.
Roles: pgjobs_reader, pgjobs_admin.$$;

COMMENT ON FUNCTION pgjobs.dashboard_workers IS $$Workers with the jobs each runs now; stale: not heard from within stale_after.
Errors: PJ002 a stale_after beyond the limits.
Roles: pgjobs_reader, pgjobs_admin.$$;

-- Managing work

COMMENT ON FUNCTION pgjobs.cancel IS $$Cancels a job. Waiting, scheduled or pending: cancelled now, with its success-triggered dependants in cascade. Active: cancel_requested is set and pgjobs_cancel sent; whichever call ends the attempt ends it cancelled. Terminal: false, nothing changes.
Errors: PJ003 an unknown id.
Roles: pgjobs_admin.$$;

COMMENT ON FUNCTION pgjobs.cancel_batch IS $$Cancels a batch's members not yet running and asks running ones to stop; returns how many it touched.
Errors: PJ003 an unknown id.
Roles: pgjobs_admin.$$;

COMMENT ON FUNCTION pgjobs.retry IS $$Makes a failed or cancelled job pending again (its dependants that its failure cancelled wait again; a failed batch member reopens its batch).
Errors: PJ001 its queue is full; PJ003 an unknown id; PJ004 the job is not failed or cancelled, or its dependency can no longer be met.
Roles: pgjobs_admin.$$;

COMMENT ON FUNCTION pgjobs.delete IS $$Deletes a terminal job with its edges and unique key; a batch member's batch is recounted.
Errors: PJ003 an unknown id; PJ004 the job is not terminal.
Roles: pgjobs_admin.$$;

COMMENT ON FUNCTION pgjobs.delete_batch IS $$Deletes a settled batch with its members and their edges; returns how many members it removed.
Errors: PJ003 an unknown id; PJ004 the batch is still executing (cancel it first).
Roles: pgjobs_admin.$$;

COMMENT ON FUNCTION pgjobs.purge IS $$Removes succeeded jobs finished before now - succeeded_before and failed or cancelled ones finished before now - failed_before (NULL: none of that kind), whole days by DROP TABLE, the boundary day row by row; settled batches go whole. Returns how many jobs it removed.
Errors: PJ002 a negative interval or one beyond the limits.
Roles: pgjobs_admin.$$;

COMMENT ON FUNCTION pgjobs.configure_queue IS $$Sets a queue's settings and returns its row; NULL leaves a setting as it is, 0 removes a limit. max_length bounds its live jobs; paused stops claims; fair turns on fair selection between group_keys (noisy_share, noisy_min_active tune it); max_active_per_group and max_active cap running jobs; status_events is all, terminal or none; retention keeps finished jobs that long; max_starts and per limit the starts of the queue's jobs to max_starts in any window of length per, across every worker (max_starts 0 removes the limit; the limit is not part of the returned row: list_rate_limits shows it). A call that sets max_active waits for the transactions writing jobs to end (its count of active jobs starts exact).
Errors: PJ002 an invalid setting (a negative limit, noisy_share outside (0, 1], an unknown status_events value, per not positive, a new rate limit without both max_starts and per).
Roles: pgjobs_admin.$$;
COMMENT ON FUNCTION pgjobs.configure_group IS $$Sets a fair queue's group's weight, in (0, 1000] (1, the default, removes it), and returns it: while several groups have work, each is served in proportion to its weight; a group with none gives its share to the others, and one that comes back neither starves nor makes up for lost turns.
Errors: PJ002 a weight outside (0, 1000], an empty queue or group_key.
Roles: pgjobs_admin.$$;
COMMENT ON FUNCTION pgjobs.fair_ring_groups IS $$The groups of a fair queue with pending work at its last claim: when each was last served (NULL: never), its place in the serving order (the ring's serve count then; 0 never served) and its weight; no row for a queue never claimed as fair.
Errors: PJ002 an empty queue.
Roles: pgjobs_reader, pgjobs_admin.$$;

COMMENT ON FUNCTION pgjobs.configure_rate_limit IS $$Limits the starts of the jobs whose rate_key is key: at most max_starts attempts start in any window of length per, plus burst, counted across every worker (a retry is a start); max_starts 0 removes the limit. Exact: a claim takes a job only with a token, in its own transaction. Jobs of a key without tokens are held back (scheduled at the key's next token times) while the claim takes other jobs. Returns the limit's row (NULL when removed).
Errors: PJ002 an empty key, a negative max_starts or burst, per not positive or missing, more than one start a microsecond.
Roles: pgjobs_admin.$$;

COMMENT ON FUNCTION pgjobs.list_rate_limits IS $$Every rate limit (scope key: a rate_key; scope queue: a whole queue) with the tokens a claim could take now and when the next token is due.
Errors: none.
Roles: pgjobs_worker, pgjobs_reader, pgjobs_admin.$$;

COMMENT ON FUNCTION pgjobs.configure_stream IS $$Sets the event log's retention and rotation period (NULL leaves one as it is); returns the settings in force as {"retention": ..., "rotate_every": ...}.
Errors: PJ002 a period that is not positive or beyond the limits.
Roles: pgjobs_admin.$$;

COMMENT ON FUNCTION pgjobs.maintain IS $$One maintenance pass: the status stream's log (inbox emptied, rotation past retention, follower marks) and the job history (slices made ahead, queue retention). One at a time: a pass that finds another running reports busy. Returns one row per action.
Errors: PJ004 called in a transaction that is not READ COMMITTED.
Roles: pgjobs_admin.$$;

COMMENT ON FUNCTION pgjobs.maintain_history IS $$The job history's part of maintain: slices made ahead and queue retention applied. Returns one row per action.
Errors: none.
Roles: pgjobs_admin.$$;

COMMENT ON FUNCTION pgjobs.dashboard_bulk IS $$Cancels or retries many jobs: the ids given, or (ids NULL) every job the list filter matches, newest first, at most max_rows. Each goes through cancel or retry; a job that refuses is reported with its error and does not stop the others.
Errors: PJ002 an unknown action or a value beyond the limits.
Roles: pgjobs_admin.$$;

COMMENT ON FUNCTION pgjobs.explain IS $$Why a job is not running, as {"reason": ..., ...details}: running (worker, lease end), terminal, waiting_dependencies (the open parents), scheduled (until), paused, queue_cap or group_cap (n of m active), rate_limited (the key's or queue's limit, next_token_at: when its next start token is due; held_until: the time a claim held the job back to), no_worker (no live worker serves its queue or kind), behind_others (how many jobs come first), claimable. Other blockers that also hold are listed under "also". NULL for an unknown id.
Errors: none.
Roles: pgjobs_producer, pgjobs_reader, pgjobs_admin.$$;

COMMENT ON FUNCTION pgjobs.capped_queues IS $$Which of these queues have a concurrency cap (max_active or max_active_per_group): the queues whose ended jobs wake the worker at once, so that capped queues run at the cap's speed, not at the poll's.
Errors: none.
Roles: pgjobs_worker, pgjobs_admin.$$;

COMMENT ON FUNCTION pgjobs.record_step IS $$Records a durable step's JSON result for the job held by the lease token, in the caller's transaction: true when recorded, false when the token no longer holds the job. A later attempt reads it with job_steps instead of running the step again.
Errors: PJ002 a name already recorded with another result, a result over 1 MB, more than 1,000 steps or 16 MB for the job, a name over 200 bytes.
Roles: pgjobs_worker, pgjobs_admin.$$;

COMMENT ON FUNCTION pgjobs.job_steps IS $$The steps (name, result) the job held by the lease token recorded in earlier attempts; no row when the token no longer holds the job.
Errors: none.
Roles: pgjobs_worker, pgjobs_admin.$$;

COMMENT ON FUNCTION pgjobs.sleep_until IS $$A durable sleep named `name` until `until`: 'parked' gives the job back (lease and attempt) as scheduled at `until`; after it resumes, the same call returns 'slept'. 'cancelled' when its cancellation was requested; NULL when the token no longer holds the job.
Errors: PJ002 an invalid name or time.
Roles: pgjobs_worker, pgjobs_admin.$$;

COMMENT ON FUNCTION pgjobs.await_signal IS $$Parks the job held by the lease token until signal(key) or `timeout_at` (NULL: no timeout), holding no lease or slot: outcome 'parked', then, called again with the same name after it resumes, 'signal' with the signal's payload or 'timeout'; 'cancelled' when its cancellation was requested. A signal sent before the wait and still kept is taken at once.
Errors: PJ002 an invalid name, key or time, or a name recorded for another key or as a sleep.
Roles: pgjobs_worker, pgjobs_admin.$$;

COMMENT ON FUNCTION pgjobs.signal IS $$Wakes every job waiting on `key` with `payload` and returns how many it woke. With no waiter the signal is kept for `keep` (default one day) for the first job that waits on the key, and 0 is returned.
Errors: PJ002 an empty or oversized key, a SQL NULL payload, a keep that is not positive.
Roles: pgjobs_producer, pgjobs_admin.$$;

COMMENT ON FUNCTION pgjobs.durable_status IS $$What a job recorded for durable execution, as JSON: its steps (name, result size, when, attempt), its sleeps and waits, and what it is parked on now (sleeping until, waiting for a key since). NULL for an unknown job.
Errors: none.
Roles: pgjobs_producer, pgjobs_reader, pgjobs_admin.$$;

COMMENT ON FUNCTION pgjobs.purge_signals IS $$Deletes the kept signals past their time and returns how many (signal() also removes up to 100 at each call).
Errors: none.
Roles: pgjobs_admin.$$;

COMMENT ON FUNCTION pgjobs.unhandled_kinds IS $$Kinds whose claimable jobs no live worker takes (its queue served by nobody, or its kind handled by nobody), read from the head of each queue in claim order, at most `sample` jobs a queue: queue, kind, how many in the sample, the oldest, and whether any live worker serves the queue. Workers log them, stats, status and the dashboard show them.
Errors: PJ002 a sample outside its limits.
Roles: pgjobs_worker, pgjobs_reader, pgjobs_admin.$$;
