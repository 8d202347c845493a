-- The SQL API from psql: enqueue, claim and complete a job with no Python at all.
--
--     psql "$PGJOBS_DSN" -X -v ON_ERROR_STOP=1 -f examples/sql_api.sql

SELECT id AS job_id, created, state FROM pgjobs.enqueue('send_sms', '{"to": "+15550100"}') \gset
SELECT :job_id AS enqueued, :'state' AS state;

-- kind_limits: a worker claims only the kinds it handles, at most n of each
SELECT id, kind, attempt, lease_token FROM pgjobs.claim('psql-worker', '{default}', 1, kind_limits => '{"send_sms": 1}') \gset
SELECT pgjobs.complete(:id, :'lease_token', '{"sent": true}') AS completed;    -- t
SELECT pgjobs.complete(:id, :'lease_token') AS completed_again;                -- f: the token no longer holds the job
SELECT id, state, attempt, result FROM pgjobs.job_status(:id);

-- a workflow: b runs after a; the batch has counters of its own
SELECT ref, id, batch_id FROM pgjobs.enqueue_many('[
  {"kind": "crop_scan", "ref": "a", "payload": {"image": "a.png"}},
  {"kind": "ocr_scan",  "ref": "b", "depends_on": [{"ref": "a"}]}
]', as_batch => true) ORDER BY ref;
SELECT kind, state FROM pgjobs.list_jobs(queue => 'default') ORDER BY id;

-- a bulk load as columns (one kind, payload and queue per job; the ids come back in the arrays' order)
SELECT count(*) AS loaded FROM pgjobs.enqueue_arrays(
  kinds    => ARRAY['index_image', 'index_image', 'index_image'],
  payloads => '[{"image": 1}, {"image": 2}, {"image": 3}]',
  queues   => ARRAY['indexing', 'indexing', 'indexing']);

-- errors carry SQLSTATE class PJ and name the bad value (ERROR:  PJ002: job: kind must be a non-empty string)
\set ON_ERROR_STOP 0
\set VERBOSITY verbose
SELECT * FROM pgjobs.enqueue('', '{}');
