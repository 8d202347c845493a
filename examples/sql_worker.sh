#!/usr/bin/env bash
# A worker in another language (here: bash and psql), through the SQL API alone: claim, do the work,
# complete or fail, until the queue is empty.
#
#     PGJOBS_DSN=postgresql://localhost/app bash examples/sql_worker.sh
set -euo pipefail
DSN=${PGJOBS_DSN:?set PGJOBS_DSN}
sql() { psql "$DSN" -X -q -t -A -v ON_ERROR_STOP=1 -F '|' "$@"; }

# some work for it (any producer, in any language, could have enqueued these)
sql -c "SELECT count(*) FROM pgjobs.enqueue_many('[{\"kind\": \"shout\", \"payload\": {\"word\": \"hello\"}},
        {\"kind\": \"shout\", \"payload\": {\"word\": \"world\"}}, {\"kind\": \"shout\", \"payload\": {}}]')" >/dev/null

while true; do
    job=$(sql -c "SELECT id, lease_token, payload->>'word' FROM pgjobs.claim('bash-worker', '{default}', 1, '30 seconds', '{\"shout\": 1}')")
    [[ -z $job ]] && break
    IFS='|' read -r id token word <<<"$job"
    if [[ -n $word ]]; then
        result=$(printf '{"shout": "%s"}' "${word^^}")
        sql -c "SELECT pgjobs.complete($id, '$token', '$result')" >/dev/null
        echo "job $id: ${word^^}"
    else
        sql -c "SELECT pgjobs.dead_letter($id, '$token', 'nothing to shout')" >/dev/null
        echo "job $id: failed (no word)"
    fi
done
sql -c "SELECT state, jobs FROM pgjobs.stats() WHERE queue = 'default' ORDER BY state" | sed 's/|/: /'
