"""Google Chat credentials (google-auth, no network: files made here, Google's endpoints served by
the loopback Chat fake), the daemon's entry checks."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import trio
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from fakes.chat_api import ChatFake
from fakes.server import serve_app
from google.auth import impersonated_credentials
from google.auth.transport.requests import Request
from google.oauth2 import credentials as user_creds
from google.oauth2 import service_account
from kesoku_gchat.adapter import serve
from kesoku_gchat.chat_api import CHAT_BOT_SCOPE, app_credentials, user_credentials
from kesoku_gchat.pubsub import PUBSUB_SCOPE, subscription_path

from kesoku.config.settings import Config, GChatConfig
from kesoku.vocab.errors import OperatorError

SCOPES = [CHAT_BOT_SCOPE, PUBSUB_SCOPE]


def service_account_file(folder: Path) -> Path:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    path = folder / "sa.json"
    info = {
        "type": "service_account",
        "project_id": "p",
        "private_key_id": "k1",
        "private_key": pem.decode(),
        "client_email": "kesoku@p.iam.gserviceaccount.com",
        "client_id": "1",
        "token_uri": "https://oauth2.googleapis.com/token",
    }
    path.write_text(json.dumps(info))
    return path


def user_adc_file(folder: Path, *, token: str | None = None) -> Path:
    """A user's ADC file (``gcloud auth application-default login``).

    With ``token``, it also holds that access token, valid for an hour: google-auth uses it as it is
    and never asks Google's token endpoint (which it cannot be pointed at: it ignores an
    authorized_user file's ``token_uri``).
    """
    path = folder / "adc.json"
    info = {"type": "authorized_user", "client_id": "c", "client_secret": "s", "refresh_token": "r"}
    if token is not None:
        expiry = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 3600))
        info.update(token=token, expiry=expiry)
    path.write_text(json.dumps(info))
    return path


@pytest.fixture(autouse=True)
def no_ambient_credentials(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS", raising=False)
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path / "gcloud"))  # no gcloud ADC of this machine
    monkeypatch.setenv("GCE_METADATA_HOST", "127.0.0.1:9")  # no metadata server either
    monkeypatch.setenv("NO_GCE_CHECK", "True")


def test_a_key_file_gives_service_account_credentials_with_the_chat_and_pubsub_scopes(
    tmp_path: Path,
) -> None:
    key = service_account_file(tmp_path)
    creds = app_credentials(GChatConfig(credentials_file=str(key)), SCOPES)
    assert isinstance(creds, service_account.Credentials)
    assert creds.service_account_email == "kesoku@p.iam.gserviceaccount.com"
    assert list(creds.scopes or ()) == SCOPES


def test_impersonation_mints_short_lived_tokens_for_the_account_from_adc(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(user_adc_file(tmp_path)))
    account = "kesoku-bot@p.iam.gserviceaccount.com"
    creds = app_credentials(GChatConfig(impersonate_service_account=account), SCOPES)
    assert isinstance(creds, impersonated_credentials.Credentials)
    assert creds.service_account_email == account
    assert creds._target_scopes == SCOPES
    assert creds._lifetime == 3600
    assert isinstance(creds._source_credentials, user_creds.Credentials)
    # At the default iam_endpoint google-auth picks the URL itself (mTLS, another universe).
    assert creds._iam_endpoint_override is None


async def test_keyless_impersonation_asks_the_iam_endpoint_of_the_config_for_its_token(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    account = "kesoku-bot@p.iam.gserviceaccount.com"
    chat = ChatFake(source_tokens={"user-token"})  # the IAM Credentials API too
    adc = user_adc_file(tmp_path, token="user-token")
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(adc))
    async with serve_app(chat.app()) as base_url:
        gchat = GChatConfig(impersonate_service_account=account, iam_endpoint=f"{base_url}/")
        creds = await trio.to_thread.run_sync(app_credentials, gchat, SCOPES)
        await trio.to_thread.run_sync(creds.refresh, Request())
    # The user's token bought the account's, for the app's scopes and an hour.
    (iam,) = chat.iam_requests()
    assert iam.path == f"/v1/projects/-/serviceAccounts/{account}:generateAccessToken"
    assert iam.headers["authorization"] == "Bearer user-token"
    assert (iam.body["scope"], iam.body["lifetime"]) == (SCOPES, "3600s")
    assert chat.account_tokens == {creds.token: account}
    assert creds.valid


def test_no_credentials_is_an_operator_error_naming_the_keys(tmp_path: Path) -> None:
    with pytest.raises(OperatorError, match=r"credentials_file.*impersonate_service_account"):
        app_credentials(GChatConfig(credentials_file=str(tmp_path / "missing.json")), SCOPES)


def test_reactions_need_a_users_adc_not_a_service_account(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(user_adc_file(tmp_path)))
    creds = user_credentials()
    assert isinstance(creds, user_creds.Credentials)
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(service_account_file(tmp_path)))
    with pytest.raises(OperatorError, match="a user's Application Default Credentials"):
        user_credentials()


def test_subscription_names() -> None:
    assert subscription_path("projects/a/subscriptions/b", None) == "projects/a/subscriptions/b"
    assert subscription_path("chat", "proj") == "projects/proj/subscriptions/chat"
    with pytest.raises(ValueError, match="project_id"):
        subscription_path("chat", None)


async def test_the_daemon_entry_refuses_a_config_without_a_subscription() -> None:
    with pytest.raises(OperatorError, match=r"\[gchat\] subscription"):
        await serve(None, Config(gchat=GChatConfig(enabled=True)))  # type: ignore[arg-type]
    await trio.lowlevel.checkpoint()
