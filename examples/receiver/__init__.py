"""An example receiver of Promesa webhooks: verify, claim, persist, answer 200, work in a job.

Start with ``app.py`` (the HTTP side), then ``jobs.py`` (the work) and ``storage.py`` (the
tables). ``README.md`` says how to run it against Promesa and what each step protects against.
"""
