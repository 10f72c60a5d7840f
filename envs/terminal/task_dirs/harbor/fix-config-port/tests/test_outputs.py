import configparser

CONFIG = "/srv/web/config.ini"


def read():
    parser = configparser.ConfigParser()
    assert parser.read(CONFIG), f"{CONFIG} is missing"
    return parser


def test_port_is_8080():
    assert read()["server"]["port"] == "8080"


def test_logging_section():
    assert read()["logging"]["level"] == "debug"


def test_other_settings_kept():
    c = read()
    assert c["server"]["host"] == "0.0.0.0"
    assert c["server"]["workers"] == "4"
    assert c["static"]["root"] == "/srv/web/static"
