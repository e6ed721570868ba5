import { nameOf, OncelyServerError } from './oncely-server-error.js'

/**
 * A publish found no stream listening on its subject. JetStream answers such a publish with "no responders", which
 * the client reports as `JetStreamNotEnabled`; this error names the subject and the fix instead (the original is
 * its `cause`).
 */
export class NoStreamForSubjectError extends OncelyServerError {
  override name = 'NoStreamForSubjectError' as const
  /** The subject no stream covers. */
  readonly subject: string
  constructor(subject: string, options?: ErrorOptions) {
    super(
      `No JetStream stream covers the subject "${subject}", so the message was not stored. Create a stream whose subjects include it (for example \`await jsm.streams.add({ name: 'ORDERS', subjects: ['${subject}'] })\` with \`jsm = await jetstreamManager(nc)\`), or map the topic to a covered subject with \`jetStreamPublisher({ subject })\`. If no stream works at all, check that the server runs with JetStream enabled (\`nats-server -js\`).`,
      options,
    )
    this.subject = subject
  }
}

/** True for a {@link NoStreamForSubjectError}, also across bundles. */
export function isNoStreamForSubjectError(error: unknown): error is NoStreamForSubjectError {
  return error instanceof NoStreamForSubjectError || nameOf(error) === 'NoStreamForSubjectError'
}
