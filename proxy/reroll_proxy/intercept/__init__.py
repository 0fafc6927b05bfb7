"""The mitmproxy front end of the proxy, for agents that ignore base-URL variables.

`addon` runs inside ``mitmdump`` from mitmproxy's own virtualenv (mitmproxy pins an ``h11``
older than the one the SDKs need, so it never shares reroll's environment); it imports only
mitmproxy and the standard library. This folder holds nothing else, because running the addon
as a script puts its folder first on ``sys.path``.
"""
