"""A KV-cache-aware router in front of `llmkern serve` replicas (needs the serve extra).

kv_index: the router's exact copy of each replica's prefix cache, from the replica's block events;
policies: cache_aware (default), approx_tree (SGLang's baseline), least_load, round_robin;
worker / core: health, KV sync, forwarding (and when a request may be tried elsewhere); app: the
HTTP routes and the SIGTERM drain; launch: processes; supervisor: restarts replicas that exit;
pd / pd_launch: the prefill-decode mode (`router --pd`, `serve --pd NPMD`)."""
