"""Wire-level fakes of the model APIs, served on loopback for the real provider SDKs to talk to.

Each module fakes one API as a Starlette app and records what it received: :mod:`.anthropic_api`
(Anthropic's Messages API, direct and on Vertex AI), :mod:`.openai_api` (OpenAI's Chat Completions,
with the context-window questions of llama.cpp, Ollama and vLLM), :mod:`.gemini_api` with
:mod:`.gemini_replies` (the Gemini API and its Vertex AI paths, context caches included), and
:mod:`.server` (serving an app on loopback in the test's trio run, with hypercorn). Each fake checks
the requests against the API's documented rules and answers a broken one as the API would (HTTP 400
and its message), so a backend that builds a wrong request fails its test as it would fail in
production.

They need the ``testing`` extra (``pip install kesoku[testing]``: starlette and hypercorn); nothing
is imported until a module is. Each module's ``contract_reply`` turns the provider-neutral replies
of :mod:`kesoku.testing.backends` into its own, so a backend speaking one of these protocols can
run :func:`~kesoku.testing.backends.check_backend_contract` against it.
"""
