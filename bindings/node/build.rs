//! Sets up the addon's link arguments (napi-build) and nothing else: the
//! key process is copied beside the addon by the npm build script, which
//! knows where the addon goes.

fn main() {
    napi_build::setup();
}
