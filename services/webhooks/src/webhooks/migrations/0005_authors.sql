-- Who last saved each webhook (its author: a user, or an API key; at most one is set). A
-- delivery sends a record only while the author may still READ every record of its object
-- (docs/auth.md). Webhooks saved before this migration have no author and send nothing until
-- someone saves them again (their deliveries fail, saying so): nobody vouches for what they send.
ALTER TABLE webhooks
    ADD COLUMN author_user_id uuid,
    ADD COLUMN author_api_key_id uuid,
    ADD CONSTRAINT webhooks_one_author
        CHECK (author_user_id IS NULL OR author_api_key_id IS NULL);
