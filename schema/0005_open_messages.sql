-- 0005: the open user messages (pending or processing). A partial index: only a user message is
-- ever in it, from its post until its turn ends, so the posts of the assistant and of tools never
-- write to it. It serves the recovery at a daemon's start and a chat attaching to a session, which
-- otherwise read the whole table or the whole session (Store.open_user_messages).
CREATE INDEX messages_open ON messages (role, status, session_id)
    WHERE role = 'user' AND status IN ('pending', 'processing');
