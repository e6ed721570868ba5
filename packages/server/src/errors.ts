// The errors @oncely/server throws at its users, one class and its guard per file under errors/.
export { isOncelyServerError, OncelyServerError } from './errors/oncely-server-error.js'
export { isResponseTooLargeError, ResponseTooLargeError } from './errors/response-too-large-error.js'
export { isStoreSetupError, StoreSetupError } from './errors/store-setup-error.js'
