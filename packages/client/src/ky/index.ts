// `@oncely/client/ky`: oncely intents for a ky instance. ky (1.14, an optional peer dependency) is only a type here:
// the instance is the caller's, and this entry imports nothing of ky at run time.
import type { OncelyKyRequestOptions } from './request.js'

export type { OncelyKyRequestOptions } from './request.js'
export { intentOf, type KyIntent } from './response.js'
export { type WithOncelyOptions, withOncely } from './with-oncely.js'

declare module 'ky' {
  interface Options {
    /**
     * How `withOncely` treats this request: `false` sends it as plain ky (even a POST), `true` makes it an intent
     * (even a GET), and an object makes it an intent with these options.
     * @default an intent when its method is one of `withOncely`'s `methods` (POST, PUT, PATCH, DELETE)
     * @example { intentId: 'checkout:cart_42' }
     */
    oncely?: boolean | OncelyKyRequestOptions
  }
}
