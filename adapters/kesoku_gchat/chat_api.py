"""The Chat REST calls Kesoku makes, through the official client (google-apps-chat, REST transport).

- ``spaces.messages.create`` (``POST /v1/{parent=spaces/*}/messages``) with ``messageReplyOption``
  ``REPLY_MESSAGE_FALLBACK_TO_NEW_THREAD`` and ``message.thread.name`` to answer in the user's
  thread, or ``message.thread.threadKey`` to keep the messages of a turn that no Chat message
  started in one thread (the first message with a key starts it; the key is the app's own);
- ``spaces.messages.update`` (``PUT /v1/{message.name=spaces/*/messages/*}``,
  ``updateMask=cardsV2``; the client's ``update_message``) to update a turn card in place (the only
  way to change a card from a Pub/Sub app: "Build a Google Chat app behind a firewall with
  Pub/Sub");
- ``spaces.messages.reactions.create`` (``POST /v1/{parent=spaces/*/messages/*}/reactions``), which
  needs *user* authentication (a Chat app's service account cannot react);
- ``media.download`` (``GET /v1/media/{resourceName}?alt=media``) for uploaded attachments, through
  google-auth's ``AuthorizedSession`` (the generated client has no media methods).

The client is synchronous: every call runs in a worker thread. Errors are mapped in that thread to
:class:`ChatApiError`, so the trio side never imports google.api_core. The client's own retries are
off (``retry=None``; it retries 503 for 30 s by default): :meth:`ChatApi._call` owns them, so a
failure is not retried twice over.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import trio

from kesoku.config.settings import CHAT_API_ENDPOINT, IAM_CREDENTIALS_ENDPOINT
from kesoku.vocab.errors import OperatorError

if TYPE_CHECKING:
    from google.auth.credentials import Credentials

    from kesoku.config.settings import GChatConfig

log = logging.getLogger(__name__)

T = TypeVar("T")

CHAT_BOT_SCOPE = "https://www.googleapis.com/auth/chat.bot"
"""App authentication (Chat API, "Authenticate as a Chat app")."""
REACTIONS_SCOPE = "https://www.googleapis.com/auth/chat.messages.reactions.create"
"""User authentication for ``reactions.create`` (Chat API, "Add a reaction to a message")."""
CLOUD_SCOPE = "https://www.googleapis.com/auth/cloud-platform"
TOKEN_LIFETIME_S = 3600
"""Impersonated tokens live an hour (the IAM Credentials API's default maximum); google-auth renews
them."""
CALL_TIMEOUT_S = 30.0
"""One REST call's timeout."""
TRIES = 6
"""Tries of a call refused with 429/5xx or cut by the network, backing off up to
:data:`RETRY_CAP_S`."""
RETRY_CAP_S = 30.0
REPLY_OPTION = "REPLY_MESSAGE_FALLBACK_TO_NEW_THREAD"
"""Reply in the named thread, or in a new one if it is gone (Chat API, ``MessageReplyOption``)."""


class ChatApiError(Exception):
    """A Chat call failed.

    Attributes:
        retryable: 429, 5xx or a network failure (worth another try); False for a refusal (4xx).
        status: The HTTP status when there was one.
    """

    def __init__(self, message: str, *, retryable: bool, status: int | None = None) -> None:
        super().__init__(message)
        self.retryable = retryable
        self.status = status


# -- credentials ----------------------------------------------------------------------------------


def app_credentials(gchat: GChatConfig, scopes: list[str]) -> Credentials:
    """The Chat app's credentials: a key file, an impersonated service account, or plain ADC.

    - ``credentials_file``: a service-account key file.
    - ``impersonate_service_account``: key-less; Application Default Credentials (a user's, or the
      machine's) mint short-lived tokens for that account through the IAM Credentials API at
      ``iam_endpoint`` (google-auth ``impersonated_credentials``; the caller needs
      ``roles/iam.serviceAccountTokenCreator``).
    - neither: Application Default Credentials as they are.

    Blocking (reads files, may query the metadata server): call it in a worker thread.

    Raises:
        OperatorError: No usable credentials, naming the key to set.
    """
    import google.auth
    from google.auth import exceptions, impersonated_credentials
    from google.oauth2 import service_account

    try:
        if gchat.credentials_file and not gchat.impersonate_service_account:
            from_file = service_account.Credentials.from_service_account_file
            credentials: Credentials = from_file(  # type: ignore[no-untyped-call]
                gchat.credentials_file, scopes=scopes
            )
            return credentials
        if gchat.impersonate_service_account:
            source, _ = google.auth.default(scopes=[CLOUD_SCOPE])
            return impersonated_credentials.Credentials(  # type: ignore[no-untyped-call]
                source_credentials=source,
                target_principal=gchat.impersonate_service_account,
                target_scopes=scopes,
                lifetime=TOKEN_LIFETIME_S,
                iam_endpoint_override=_iam_token_url(gchat),
            )
        credentials, _ = google.auth.default(scopes=scopes)
        return credentials
    except (exceptions.DefaultCredentialsError, OSError, ValueError) as exc:
        raise OperatorError(
            f"gchat: no Google credentials ({exc}); "
            "set [gchat] credentials_file (a service-account key) or "
            "impersonate_service_account (with `gcloud auth application-default login`)"
        ) from None


def _iam_token_url(gchat: GChatConfig) -> str | None:
    """``generateAccessToken`` of the impersonated account at ``[gchat] iam_endpoint``.

    None at the default: google-auth then picks its own URL (the mTLS host when client
    certificates are on, another universe's domain), which a fixed URL would override.
    """
    root = gchat.iam_endpoint.rstrip("/")
    if root == IAM_CREDENTIALS_ENDPOINT:
        return None
    account = gchat.impersonate_service_account
    # The IAM Credentials API's path (projects.serviceAccounts.generateAccessToken); "-": the
    # project is inferred from the account.
    return f"{root}/v1/projects/-/serviceAccounts/{account}:generateAccessToken"


def user_credentials() -> Credentials:
    """The user's Application Default Credentials.

    They come from ``gcloud auth application-default login --scopes=...``. Reactions need a user; a
    service account's ADC would be refused by Chat, so it is refused here.

    Raises:
        OperatorError: No ADC, or ADC that are not a user's.
    """
    import google.auth
    from google.auth import exceptions
    from google.oauth2 import credentials as user

    try:
        credentials, _ = google.auth.default(scopes=[REACTIONS_SCOPE])
    except exceptions.DefaultCredentialsError as exc:
        raise OperatorError(f"gchat: reaction_emoji needs user credentials: {exc}") from None
    if not isinstance(credentials, user.Credentials):
        raise OperatorError(
            "gchat: reaction_emoji needs a user's Application Default Credentials "
            f"(`gcloud auth application-default login --scopes={REACTIONS_SCOPE},{CLOUD_SCOPE}`), "
            f"not {type(credentials).__name__}"
        )
    return credentials


# -- the client -----------------------------------------------------------------------------------


@dataclass
class ChatApi:
    """The Chat service of the app, and optionally one acting as the user (reactions).

    Build it with :meth:`connect` (the client library loads in a worker thread).

    Args:
        client: ``google.apps.chat_v1.ChatServiceClient`` with app credentials.
        session: ``google.auth.transport.requests.AuthorizedSession`` with the same credentials
            (media).
        endpoint: The API's base URL (a loopback fake in tests).
        user_client: A ``ChatServiceClient`` with user credentials, for reactions; None: no
            reactions.
    """

    client: Any
    session: Any
    endpoint: str = CHAT_API_ENDPOINT
    user_client: Any = None

    @classmethod
    async def connect(
        cls,
        credentials: Credentials,
        *,
        endpoint: str = CHAT_API_ENDPOINT,
        user: Credentials | None = None,
    ) -> ChatApi:
        """Build the clients (in a worker thread: importing the library takes a few hundred ms).

        Args:
            credentials: The app's credentials.
            endpoint: ``[gchat] chat_api_endpoint``: ``https://chat.googleapis.com``, a proxy, or
                ``http://127.0.0.1:PORT`` for a fake (a path after the host is kept).
            user: User credentials for reactions.
        """
        endpoint = endpoint.rstrip("/")  # the client appends "/v1/…"

        def build() -> ChatApi:
            from google.auth.transport.requests import AuthorizedSession

            session = AuthorizedSession(credentials)  # type: ignore[no-untyped-call]
            return cls(_client(credentials, endpoint), session, endpoint, _user(user, endpoint))

        return await trio.to_thread.run_sync(build)

    async def create_message(
        self, space: str, body: dict[str, Any], *, thread: str = "", thread_key: str = ""
    ) -> str:
        """Post a message in a space; returns the new message's name.

        Args:
            space: ``spaces/…``.
            body: The ``Message`` body (cards).
            thread: A thread's name (``spaces/…/threads/…``) to answer in.
            thread_key: Else, the app's key of a thread: the first message with it starts the
                thread, the next ones answer in it. Neither: the message starts a thread of its own
                (in a space without threads, it is simply the next message).
        """

        def call() -> str:
            from google.apps import chat_v1

            message = chat_v1.Message.from_json(json.dumps(body))
            request = chat_v1.CreateMessageRequest(parent=space, message=message)
            if thread or thread_key:
                request.message.thread = (
                    chat_v1.Thread(name=thread) if thread else chat_v1.Thread(thread_key=thread_key)
                )
                request.message_reply_option = getattr(
                    chat_v1.CreateMessageRequest.MessageReplyOption, REPLY_OPTION
                )
            created = self.client.create_message(
                request=request, timeout=CALL_TIMEOUT_S, retry=None
            )
            return str(created.name)

        return await self._call(call)

    async def update_message(self, name: str, body: dict[str, Any]) -> None:
        """Replace a message's cards (``updateMask=cards_v2``)."""

        def call() -> None:
            from google.apps import chat_v1
            from google.protobuf import field_mask_pb2  # type: ignore[import-untyped]

            message = chat_v1.Message.from_json(json.dumps({"cardsV2": body.get("cardsV2", [])}))
            message.name = name
            mask = field_mask_pb2.FieldMask(paths=["cards_v2"])
            self.client.update_message(
                message=message, update_mask=mask, timeout=CALL_TIMEOUT_S, retry=None
            )

        await self._call(call)

    async def create_reaction(self, message_name: str, emoji: str) -> None:
        """React to a message as the user.

        The emoji is a unicode one, or a custom one as ``customEmojis/ID``.
        """
        if self.user_client is None:
            return

        def call() -> None:
            from google.apps import chat_v1

            if emoji.startswith("customEmojis/"):
                mark = chat_v1.Emoji(custom_emoji=chat_v1.CustomEmoji(name=emoji))
            else:
                mark = chat_v1.Emoji(unicode=emoji)
            reaction = chat_v1.Reaction(emoji=mark)
            self.user_client.create_reaction(
                parent=message_name, reaction=reaction, timeout=CALL_TIMEOUT_S, retry=None
            )

        await self._call(call)

    async def download(self, resource_name: str) -> bytes:
        """Download an uploaded attachment's bytes (``media.download``)."""

        def call() -> bytes:
            import requests

            url = f"{self.endpoint}/v1/media/{resource_name}"
            try:
                response = self.session.get(url, params={"alt": "media"}, timeout=CALL_TIMEOUT_S)
            except requests.RequestException as exc:
                raise ChatApiError(f"media.download: {exc}", retryable=True) from None
            if response.status_code != 200:
                status = int(response.status_code)
                retryable = status == 429 or status >= 500
                raise ChatApiError(
                    f"media.download: HTTP {status}", retryable=retryable, status=status
                )
            return bytes(response.content)

        return await self._call(call)

    async def _call(self, call: Callable[[], T]) -> T:
        """Run a call in a worker thread, retrying 429, 5xx and network failures with backoff."""
        delay_s = 1.0
        for attempt in range(1, TRIES + 1):
            try:
                # Abandoned on cancel: a stopping adapter does not wait out a slow call (its result
                # is dropped).
                return await trio.to_thread.run_sync(_mapped, call, abandon_on_cancel=True)
            except ChatApiError as exc:
                if not exc.retryable or attempt == TRIES:
                    raise
                log.warning("gchat: %s; retrying in %g s", exc, delay_s)
            await trio.sleep(delay_s)
            delay_s = min(delay_s * 2, RETRY_CAP_S)
        raise AssertionError("unreachable")


def _mapped(call: Callable[[], T]) -> T:
    """Run ``call``, turning the client library's errors into :class:`ChatApiError`.

    Runs in the worker thread.
    """
    from google.api_core import exceptions as api
    from google.auth import exceptions as auth
    from google.protobuf import json_format

    try:
        return call()
    except ChatApiError:
        raise
    except api.GoogleAPICallError as exc:
        status = exc.code if isinstance(exc.code, int) else None
        retryable = isinstance(exc, api.TooManyRequests | api.ServerError | api.ServiceUnavailable)
        raise ChatApiError(f"Chat API: {exc}", retryable=retryable, status=status) from None
    except auth.TransportError as exc:
        raise ChatApiError(f"Chat API unreachable: {exc}", retryable=True) from None
    except auth.RefreshError as exc:
        raise ChatApiError(f"Chat API credentials: {exc}", retryable=False) from None
    except json_format.ParseError as exc:  # a card this module built wrongly: a bug, not a retry
        raise ChatApiError(f"invalid message body: {exc}", retryable=False) from None
    except OSError as exc:  # requests' ConnectionError is an OSError
        raise ChatApiError(f"Chat API unreachable: {exc}", retryable=True) from None


def _client(credentials: Credentials, endpoint: str) -> Any:
    from google.apps import chat_v1
    from google.apps.chat_v1.services.chat_service.transports.rest import ChatServiceRestTransport

    transport = ChatServiceRestTransport(host=endpoint, credentials=credentials)
    return chat_v1.ChatServiceClient(transport=transport)


def _user(credentials: Credentials | None, endpoint: str) -> Any:
    return None if credentials is None else _client(credentials, endpoint)
