"""The mitmproxy front end of the proxy, for agents that ignore base-URL variables.

`addon` runs inside ``mitmdump`` from mitmproxy's own virtualenv (mitmproxy pins an ``h11``
older than the one the SDKs need, so it never shares reroll's environment); it imports only
mitmproxy, the standard library and `url_denylist` (a task's deny list, standard library only,
imported by its plain name there). This folder holds nothing else, because running the addon as
a script puts its folder first on ``sys.path`` (no module here may shadow another's name).
"""
