"""OpenAI's Batch API (`/v1/files`, `/v1/batches`) for chat pages, on the document-jobs engine.

    lines     the input file's rules (what fails the whole batch, what fails one line) and
              the output line's shape
    requests  one line through the chat route's steps (aliases, policy, media) to the relay
    results   the output and error files, written from the kept lines at the end
    runner    the BatchRunner: the jobs' Runner (claims, leases, restarts) running batches
    view      a batch and a file as OpenAI's API shows them

A batch is a job record in the store's batch tables (app/store/, `batches=True`): its input file
is the record's document, each answered line a kept "page" (its number: the line's), so a
gateway that dies mid-batch is replaced as for a job, and only unanswered lines run again.
"""
