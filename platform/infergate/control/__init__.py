"""The control plane: what is served, and how a new version rolls out.

- ``service``: the running control plane, wired together; ``infergate up`` hosts it.
- ``reconcile``: converges Triton and the front-end's traffic table on the registry;
  ``load_failures`` tells a fault of the place from one of a version's files.
- ``rollouts``: canary rollouts against the registry's aliases and tags.
- ``policy``: the rollout policy, its state machine and the canary analysis (pure).
- ``shadow``: the shadow stage's sequential tests on mirrored pairs (pure).
- ``report``: the decision trail an ended rollout leaves on the canary's version.
- ``residency``: the budget of versions loaded in each Triton, its eviction order and
  where a version goes in a fleet (pure); ``on_demand`` loads what replicas ask for and
  unloads idle versions.
- ``state``: the Ray actor that carries traffic tables to the replicas and their
  counters back.
- ``admin``: the admin API (canary commands, the MLflow webhook); ``webhooks`` registers
  the webhook and verifies its deliveries.
- ``cli``: the ``infergate canary ...`` commands, sent to the admin API.
"""
