"""A small documentation site for `bench followup`: the pages of a made-up Python web framework ("Lantern"),
written the way framework docs are (an intro, a sponsors page, release notes, and one page per feature,
each split into sections), plus multi-turn sessions whose follow-ups lean on the earlier turns.

The text is written for this benchmark (no page is copied from a real project). Each page's sections are
its chunks. A session's turns each name the page that answers them (`Turn.page`).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Page:
    slug: str
    title: str
    sections: tuple[str, ...]


@dataclass(frozen=True)
class Turn:
    question: str
    page: str  # the slug of the page that answers it


PAGES: tuple[Page, ...] = (
    Page(
        "index",
        "Lantern: introduction",
        (
            "Lantern is a lightweight ASGI framework for building async web services in Python. It gives you "
            "routing, requests and responses, WebSockets, background work and a test client, and stays out of "
            "the way for everything else.",
            "Install it with pip install lantern. Lantern needs Python 3.10 or newer and an ASGI server such "
            "as uvicorn or hypercorn to run your application.",
            "This documentation walks through each part in turn. If you are new, start with the quick start, "
            "then read the pages on routing and responses. You can write your own extensions once you know "
            "the basics.",
        ),
    ),
    Page(
        "sponsors",
        "Sponsorship",
        (
            "Lantern is developed in the open and funded by its users. If your company depends on it, consider "
            "sponsoring the project so that maintainers can keep writing new features and fixing bugs.",
            "Sponsors at the gold tier get their logo on the front page of the documentation. You can set up a "
            "monthly sponsorship of your own through the project's funding page, or make a one-time donation.",
        ),
    ),
    Page(
        "release-notes",
        "Release notes",
        (
            "Version 0.9 adds lifespan state, typed path converters and a faster static file handler. The old "
            "on_startup and on_shutdown arguments still work but are deprecated.",
            "Version 0.8 rewrote the test client on top of httpx, added WebSocket close codes and fixed a bug "
            "where exception handlers were skipped for errors raised inside middleware.",
            "Version 0.7 introduced class-based endpoints and the authentication middleware.",
        ),
    ),
    Page(
        "contributing",
        "Contributing",
        (
            "We welcome contributions of every size. Open an issue first for larger changes so that we can "
            "agree on the design before you write the code.",
            "Run the test suite with scripts/test and the linters with scripts/lint. Every pull request needs "
            "tests and an entry in the release notes. Write your own examples in the docs folder.",
        ),
    ),
    Page(
        "middleware",
        "Middleware",
        (
            "Middleware wraps your whole application: it sees every request before your endpoints do and every "
            "response after. Add middleware by passing a list to the application: "
            "Lantern(routes=routes, middleware=[Middleware(GZipMiddleware, minimum_size=500)]). Middleware runs "
            "in the order it is listed, the first one outermost.",
            "Lantern ships middleware for CORS, GZip compression, trusted hosts, HTTPS redirects and sessions. "
            "Each one is configured with keyword arguments on Middleware(...).",
            "To write your own middleware, subclass BaseHTTPMiddleware and implement async def dispatch(self, "
            "request, call_next): call response = await call_next(request), change the response, and return "
            "it. For example, a middleware that adds an X-Process-Time header measures the time around "
            "call_next.",
            "A middleware class can also be a plain ASGI class: define __init__(self, app) to keep the wrapped "
            "application and async def __call__(self, scope, receive, send) to handle each connection. This "
            "pure ASGI form avoids the overhead of BaseHTTPMiddleware and works for WebSocket connections too. "
            "Register the class with Middleware(MyMiddleware, option=value).",
        ),
    ),
    Page(
        "cors",
        "CORS",
        (
            "Browsers block cross-origin requests unless the server allows them. Enable CORSMiddleware with the "
            "origins you trust: Middleware(CORSMiddleware, allow_origins=['https://example.com']).",
            "allow_methods, allow_headers and allow_credentials control the preflight answer. Use "
            "allow_origin_regex to match a family of subdomains.",
        ),
    ),
    Page(
        "routing",
        "Routing",
        (
            "Routes map URL paths to endpoints. Pass a list of Route objects to the application: "
            "Route('/users/{username}', user_detail). Path parameters in braces are handed to the endpoint in "
            "request.path_params.",
            "Convertors restrict and convert a path parameter: {user_id:int} only matches digits and gives "
            "an integer, {path:path} matches the rest of the path including slashes, {value:float} a number. "
            "You can register your own convertor for custom types.",
            "Mount groups routes under a prefix: Mount('/admin', routes=admin_routes). When no route matches, "
            "the router answers 404 Not Found, or 405 Method Not Allowed when the path matched but the method "
            "did not.",
        ),
    ),
    Page(
        "endpoints",
        "Class-based endpoints",
        (
            "An HTTPEndpoint class groups the handlers of one path: subclass it and define async def get(self, "
            "request) and async def post(self, request). Lantern dispatches each request to the method named "
            "after its HTTP verb.",
            "WebSocketEndpoint does the same for WebSockets with on_connect, on_receive and on_disconnect "
            "methods and an encoding attribute of 'text', 'bytes' or 'json'.",
        ),
    ),
    Page(
        "requests",
        "Requests",
        (
            "The Request object gives you the method, URL, headers, query parameters and cookies of an "
            "incoming request. Read the body with await request.body(), await request.json() or await "
            "request.form().",
            "request.client holds the address of the client, request.state is a place to attach values for "
            "the rest of the request, and request.app is the application itself.",
        ),
    ),
    Page(
        "responses",
        "Responses",
        (
            "Return a Response from an endpoint: PlainTextResponse, HTMLResponse, JSONResponse, "
            "RedirectResponse, FileResponse or StreamingResponse. Each one sets the right content type.",
            "StreamingResponse takes an async generator and sends each chunk as it is produced. Set cookies "
            "with response.set_cookie(key, value, max_age=...).",
        ),
    ),
    Page(
        "websockets",
        "WebSockets",
        (
            "A WebSocket route takes an endpoint that receives a WebSocket object: "
            "WebSocketRoute('/ws', websocket_endpoint). Call await websocket.accept() to accept the connection "
            "before sending or receiving anything.",
            "Send and receive with send_text, send_bytes and send_json, and receive_text, receive_bytes and "
            "receive_json. iter_text() and iter_json() loop over incoming messages until the client goes away.",
            "Close the connection with await websocket.close(code=1000) for a normal closure, or another close "
            "code such as 1008 for a policy violation. A WebSocketDisconnect exception tells you the client "
            "closed first.",
        ),
    ),
    Page(
        "background",
        "Background tasks",
        (
            "A background task runs after the response has been sent, so the client does not wait for it. "
            "Attach one to a response: JSONResponse(data, background=BackgroundTask(send_welcome_email, to=address)).",
            "To run several, use BackgroundTasks and call tasks.add_task(func, *args) for each one; they run "
            "one after another in the order they were added.",
            "Background tasks run in the same process after the response body is complete. If the client "
            "disconnects early the tasks still run; for long or critical jobs use a proper job queue instead.",
        ),
    ),
    Page(
        "testing",
        "Testing",
        (
            "TestClient lets you call your application in tests without a running server: client = "
            "TestClient(app); response = client.get('/'). It speaks the httpx API, so assertions read like "
            "ordinary HTTP code.",
            "The test client can open WebSocket sessions too: with client.websocket_connect('/ws') as session: "
            "session.send_text('hello') and session.receive_text(). Use it as a context manager so that lifespan "
            "events run.",
            "Override dependencies and settings in tests by building the application in a factory function "
            "that takes them as arguments.",
        ),
    ),
    Page(
        "static-files",
        "Static files",
        (
            "Serve a folder of static files by mounting StaticFiles: Mount('/static', "
            "app=StaticFiles(directory='static'), name='static').",
            "With html=True, StaticFiles serves index.html for a directory and 404.html for a missing file, "
            "which is what a single-page application needs.",
            "StaticFiles sends ETag and Last-Modified headers and answers conditional requests with 304 Not "
            "Modified, so browsers cache files and revalidate them cheaply.",
        ),
    ),
    Page(
        "templates",
        "Templates",
        (
            "Lantern renders Jinja2 templates: templates = Jinja2Templates(directory='templates'), then return "
            "templates.TemplateResponse(request, 'index.html', {'user': user}).",
            "The request is always passed to the template context, so templates can call url_for('static', "
            "path='/app.css') and read request.url.",
            "Add filters and globals on templates.env: templates.env.filters['money'] = format_money defines a "
            "custom filter usable as {{ price | money }} in every template.",
        ),
    ),
    Page(
        "lifespan",
        "Lifespan",
        (
            "The lifespan function runs code when the application starts and stops. Write an async context "
            "manager: everything before yield runs at startup, for example opening a database connection pool.",
            "Everything after yield runs at shutdown: close the pool there. Lantern waits for the shutdown code "
            "before the process exits.",
            "Values yielded as a dictionary from lifespan become the lifespan state: each request sees them as "
            "request.state, so handlers reach the pool without a global variable.",
        ),
    ),
    Page(
        "database",
        "Databases",
        (
            "Lantern does not ship an ORM. Use the database library you like: SQLAlchemy, databases or an "
            "async driver such as asyncpg.",
            "Create the engine once per application, not per request, and run migrations with your tool of "
            "choice before the server starts.",
        ),
    ),
    Page(
        "exceptions",
        "Exceptions",
        (
            "Exception handlers turn errors into responses. Pass exception_handlers={404: not_found} to the "
            "application to return your own 404 page, or {500: server_error} for internal errors.",
            "Handlers can be keyed by exception class as well as status code: {PaymentRequired: "
            "payment_handler} handles your own exception classes wherever they are raised.",
            "Once a streaming response has started its body, an error can no longer change the status code: "
            "the connection is closed and the error is logged.",
        ),
    ),
    Page(
        "authentication",
        "Authentication",
        (
            "Add authentication with AuthenticationMiddleware and a backend class that implements async def "
            "authenticate(self, conn) and returns credentials and a user, or None for anonymous requests.",
            "Protect an endpoint with the @requires('authenticated') decorator; requires('admin') checks for a "
            "scope, and redirect= sends anonymous users to a login page instead of answering 403.",
            "The requires decorator works on the methods of an HTTPEndpoint class as well: decorate async def "
            "get(self, request) with @requires('admin') inside the class.",
        ),
    ),
    Page(
        "config",
        "Configuration",
        (
            "Config reads settings from environment variables and a .env file: config = Config('.env'); DEBUG "
            "= config('DEBUG', cast=bool, default=False).",
            "Secret values such as API keys can be wrapped in Secret so that they are not printed in logs or "
            "tracebacks.",
        ),
    ),
)

SESSIONS: tuple[tuple[Turn, ...], ...] = (
    (
        Turn("How do I add middleware?", "middleware"),
        Turn("And how do I write my own?", "middleware"),
        Turn("Show it with a class instead.", "middleware"),
    ),
    (
        Turn("How do I define a route with a path parameter?", "routing"),
        Turn("Can I restrict it to integers?", "routing"),
        Turn("What happens when nothing matches?", "routing"),
    ),
    (
        Turn("How do I accept a WebSocket connection?", "websockets"),
        Turn("How do I send JSON over it?", "websockets"),
        Turn("And close it cleanly?", "websockets"),
    ),
    (
        Turn("How can I run a task after the response is sent?", "background"),
        Turn("Can I have several of them?", "background"),
        Turn("Do they still run if the client disconnects?", "background"),
    ),
    (
        Turn("How do I test my application without a server?", "testing"),
        Turn("Does that work for websockets too?", "testing"),
        Turn("How do I swap settings for it?", "testing"),
    ),
    (
        Turn("How do I serve static files?", "static-files"),
        Turn("Can it serve index.html for a folder?", "static-files"),
        Turn("What about caching?", "static-files"),
    ),
    (
        Turn("How do I render Jinja2 templates?", "templates"),
        Turn("Is the request available inside?", "templates"),
        Turn("Show me a custom filter.", "templates"),
    ),
    (
        Turn("How do I open a database pool when the app starts?", "lifespan"),
        Turn("And close it again?", "lifespan"),
        Turn("Where do I keep it so that handlers can use it?", "lifespan"),
    ),
    (
        Turn("How do I return my own 404 page?", "exceptions"),
        Turn("Can I do that for my own exception classes?", "exceptions"),
        Turn("And in the middle of streaming?", "exceptions"),
    ),
    (
        Turn("How do I add authentication?", "authentication"),
        Turn("How do I require a scope on one endpoint?", "authentication"),
        Turn("Show it on a class instead.", "authentication"),
    ),
)

# Follow-ups that change the subject: the new one is named, and must win over the earlier turns' topic.
SWITCHES: tuple[tuple[Turn, ...], ...] = (
    (
        Turn("How do I add middleware?", "middleware"),
        Turn("How do I serve static files instead?", "static-files"),
    ),
    (
        Turn("How do I accept a WebSocket connection?", "websockets"),
        Turn("And how do I run a background task after a response?", "background"),
    ),
    (
        Turn("How do I render Jinja2 templates?", "templates"),
        Turn("How do I read settings from environment variables?", "config"),
    ),
    (
        Turn("How do I return my own 404 page?", "exceptions"),
        Turn("And how do I allow cross-origin requests?", "cors"),
    ),
    (
        Turn("How do I define a route with a path parameter?", "routing"),
        Turn("Now how do I test the app without a server?", "testing"),
    ),
)
